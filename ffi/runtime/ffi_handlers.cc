// XLA FFI handlers: the custom calls that jaxll's lowering emits.
//
//   jaxll_all_reduce          one rank's all-reduce inside an SPMD program
//                             (command-buffer compatible: every per-call value
//                             lives on the device); operands x, order; results
//                             y, order (see AllReduceExecute)
//   (jaxll.testing's virtual-rank calls have their handlers in
//   ffi/testing/virtual_handlers.cc, on the helpers of ffi_common.h)
//   jaxll_device_ordinal      writes the device ordinal XLA passes to handlers
//                             (lets tests check it against Device.local_hardware_id)
//   jaxll_check               host-only (never in a command buffer): fails the
//                             program with the recorded error when a workspace
//                             it uses has one (see jaxll/lowering.py)
//   jaxll_all_reduce_rmsnorm  all-reduce + residual add + RMSNorm in one kernel
//                             (command-buffer compatible); operands x, residual,
//                             weight, order; results normed, new_residual, order
//   jaxll_noop                launches one empty kernel (the custom-call floor the
//                             benchmark measures; command-buffer compatible)
//   jaxll_join                does nothing: joins the lowering's order chains
//                             across loops, branches and functions (operands: a
//                             value and what it must come after; command-buffer
//                             compatible)
#include "ffi_handlers.h"
#include "ffi_common.h"

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "../kernels/all_reduce.h"
#include "workspace.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxll {
namespace handlers {

ffi::Error to_dtype(ffi::DataType t, DType* out) {
  switch (t) {
    case ffi::DataType::F32: *out = DType::kF32; return ffi::Error::Success();
    case ffi::DataType::BF16: *out = DType::kBF16; return ffi::Error::Success();
    case ffi::DataType::F16: *out = DType::kF16; return ffi::Error::Success();
    case ffi::DataType::S32: *out = DType::kI32; return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument(
          "jaxll: no all-reduce kernel for this element type (supported: float32, bfloat16, "
          "float16, int32)");
  }
}

ffi::Error check_call(int64_t algorithm, int64_t op) {
  if (algorithm < 1 || algorithm > kLastAlgorithm) {
    return ffi::Error::InvalidArgument("jaxll: unknown algorithm code " +
                                       std::to_string(algorithm));
  }
  if (op < 0 || op > static_cast<int64_t>(ReduceOp::kMin)) {
    return ffi::Error::InvalidArgument("jaxll: unknown reduction code " + std::to_string(op));
  }
  return ffi::Error::Success();
}

ffi::Error use_device(int ordinal) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != ordinal) {
    if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) {
      return ffi::Error::Internal(std::string("jaxll: cudaSetDevice failed: ") +
                                  cudaGetErrorString(e));
    }
  }
  return ffi::Error::Success();
}

// A launcher's error. cudaErrorInvalidValue means "no kernel for the
// combination" only where `kernel_exists` is false; where the call has a kernel
// it is the launch that failed (a grid, cluster or parameter block CUDA
// refused, or, in one launch of virtual ranks, ranks whose plans differ), and
// it is reported as such rather than blamed on the call's types.
ffi::Error launch_error(cudaError_t e, const Workspace& c, const std::string& what,
                        bool kernel_exists) {
  if (e == cudaErrorInvalidValue && !kernel_exists) {
    return ffi::Error::InvalidArgument(
        "jaxll: workspace " + std::to_string(c.id()) + " has no kernel for " + what +
        " (algorithm, element type and reduction do not go together)");
  }
  return ffi::Error::Internal("jaxll: launching " + what + " on workspace " +
                              std::to_string(c.id()) + " failed: " + cudaGetErrorName(e) + " (" +
                              cudaGetErrorString(e) + ")");
}

// Whether the fused call's operands agree: one element type; residual, normed
// and new_residual of x's element count; weight of `hidden` elements.
bool rmsnorm_operands_match(const ffi::AnyBuffer& x, const ffi::AnyBuffer& residual,
                            const ffi::AnyBuffer& weight, const ffi::AnyBuffer& normed,
                            const ffi::AnyBuffer& new_residual, int64_t hidden) {
  const size_t count = x.element_count();
  for (const ffi::AnyBuffer* b : {&residual, &weight, &normed, &new_residual}) {
    if (b->element_type() != x.element_type()) return false;
  }
  return residual.element_count() == count && normed.element_count() == count &&
         new_residual.element_count() == count &&
         static_cast<int64_t>(weight.element_count()) == hidden;
}

// The fused kernel's exchange from the FFI attribute "protocol"
// (RmsNormProtocol's values, rmsnorm_protocol_name's names).
ffi::Error to_rmsnorm_protocol(int32_t code, RmsNormProtocol* out) {
  if (rmsnorm_protocol_name(code) == nullptr) {
    return ffi::Error::InvalidArgument("jaxll: all_reduce_rmsnorm: unknown protocol code " +
                                       std::to_string(code) + " (0 to " +
                                       std::to_string(kRmsNormProtocolCount - 1) + ")");
  }
  *out = static_cast<RmsNormProtocol>(code);
  return ffi::Error::Success();
}

// A fused launch's error: a protocol asked for where it cannot serve is the
// caller's (InvalidArgument), the rest as launch_error reports them (the
// callers have checked rmsnorm_unsupported: the kernel exists).
ffi::Error rmsnorm_launch_error(cudaError_t e, Workspace& c, const std::string& what,
                                RmsNormProtocol protocol) {
  if (e == cudaErrorNotSupported) {
    return ffi::Error::InvalidArgument("jaxll: " + what + ": the protocol asked for cannot serve "
                                       "this call: " + rmsnorm_refusal(protocol) +
                                       "; use protocol auto or LL16");
  }
  return launch_error(e, c, what, true);
}

}  // namespace handlers

namespace {

using namespace handlers;

// The rank of workspace `workspace_id` (held by `hold`, which the caller keeps
// until its launch is enqueued) on device `ordinal`, ready for a call: it
// exists, the device is a member, and no kernel recorded an error there.
ffi::Error find_rank(const WorkspaceRef& hold, int64_t workspace_id, int32_t ordinal,
                     Workspace** ws, Rank** rank) {
  Workspace* c = hold.get();
  if (c == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jaxll: workspace " + std::to_string(workspace_id) +
                          " does not exist (freed by jaxll.free_workspaces()?); call the "
                          "jitted function again after clearing JAX's caches "
                          "(jax.clear_caches()) so it is lowered anew");
  }
  Rank* r = c->rank_for_ordinal(ordinal);
  if (r == nullptr || !c->connected()) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jaxll: CUDA device " + std::to_string(ordinal) +
                          " is not a member of workspace " + std::to_string(workspace_id));
  }
  if (uint64_t word = c->error_word(*r)) {
    return ffi::Error(ffi::ErrorCode::kAborted, c->describe_error(*r, word));
  }
  *ws = c;
  *rank = r;
  return ffi::Error::Success();
}

// `order` in and out: 4 bytes that chain the calls of one block so XLA keeps
// them in program order and never runs two at once (jaxll/lowering.py); never
// read or written here.
ffi::Error AllReduceExecute(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x,
                            ffi::AnyBuffer /*order*/, ffi::Result<ffi::AnyBuffer> y,
                            ffi::Result<ffi::AnyBuffer> /*order_out*/, int64_t workspace_id,
                            int64_t algorithm, int64_t op) {
  const WorkspaceRef hold(workspace_id);
  Workspace* c = nullptr;
  Rank* r = nullptr;
  if (ffi::Error e = find_rank(hold, workspace_id, ordinal, &c, &r); e.failure()) return e;
  if (ffi::Error e = check_call(algorithm, op); e.failure()) return e;
  DType dtype;
  if (ffi::Error e = to_dtype(x.element_type(), &dtype); e.failure()) return e;
  const int64_t count = static_cast<int64_t>(x.element_count());
  if (y->element_count() != x.element_count() || y->element_type() != x.element_type()) {
    return ffi::Error::InvalidArgument("jaxll: all_reduce output must match its input");
  }
  if (count == 0) return ffi::Error::Success();
  if (ffi::Error e = use_device(ordinal); e.failure()) return e;
  cudaError_t e = launch_all_reduce(static_cast<Algorithm>(algorithm), dtype,
                                    static_cast<ReduceOp>(op), r->view, x.untyped_data(),
                                    y->untyped_data(), count, stream);
  if (e != cudaSuccess) {
    return launch_error(e, *c, "an all-reduce of " + std::to_string(count) + " elements",
                        has_kernel(static_cast<Algorithm>(algorithm), dtype, static_cast<ReduceOp>(op)));
  }
  return ffi::Error::Success();
}

// Runs on the host each time XLA runs the program (it has no command-buffer
// trait, so XLA never records it): fails the run when one of the workspaces the
// program's kernel calls use is gone or holds an error. Reads only host memory.
// `order_out` is the first link of the program's order chain; never written.
ffi::Error CheckExecute(ffi::Result<ffi::AnyBuffer> /*order_out*/, ffi::Span<const int64_t> workspaces) {
  for (int64_t id : workspaces) {
    const WorkspaceRef hold(id);
    Workspace* c = hold.get();
    if (c == nullptr) {
      return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                        "jaxll: workspace " + std::to_string(id) +
                            " was freed (jaxll.free_workspaces()) after this program was "
                            "compiled; compile it again (jax.clear_caches() or a new jax.jit)");
    }
    for (int g = 0; g < c->group_count(); ++g) {
      for (int r = 0; r < c->group_size(); ++r) {
        if (!c->has_rank(g, r)) continue;
        if (uint64_t word = c->error_word(c->rank(g, r))) {
          return ffi::Error(ffi::ErrorCode::kAborted, c->describe_error(c->rank(g, r), word));
        }
      }
    }
  }
  return ffi::Error::Success();
}

ffi::Error DeviceOrdinalExecute(cudaStream_t stream, int32_t ordinal,
                                ffi::Result<ffi::Buffer<ffi::S32>> out) {
  if (out->element_count() != 1) return ffi::Error::InvalidArgument("expects a scalar output");
  cudaError_t e = launch_fill_i32(out->typed_data(), ordinal, stream);
  if (e != cudaSuccess) return ffi::Error::Internal(cudaGetErrorString(e));
  return ffi::Error::Success();
}

// All-reduce of x over the workspace's group + residual + RMSNorm with weight
// (x, residual, normed, new_residual: (..., hidden); weight: (hidden,); one
// element type); `order` as for jaxll_all_reduce.
ffi::Error RmsNormExecute(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x,
                          ffi::AnyBuffer residual, ffi::AnyBuffer weight, ffi::AnyBuffer /*order*/,
                          ffi::Result<ffi::AnyBuffer> normed,
                          ffi::Result<ffi::AnyBuffer> new_residual,
                          ffi::Result<ffi::AnyBuffer> /*order_out*/, int64_t workspace_id, float eps,
                          int32_t protocol_code) {
  const WorkspaceRef hold(workspace_id);
  Workspace* c = nullptr;
  Rank* r = nullptr;
  if (ffi::Error e = find_rank(hold, workspace_id, ordinal, &c, &r); e.failure()) return e;
  RmsNormProtocol protocol;
  if (ffi::Error e = to_rmsnorm_protocol(protocol_code, &protocol); e.failure()) return e;
  DType dtype;
  if (ffi::Error e = to_dtype(x.element_type(), &dtype); e.failure()) return e;
  const auto dims = x.dimensions();
  if (dims.size() < 1) return ffi::Error::InvalidArgument("jaxll: all_reduce_rmsnorm needs a hidden axis");
  const int64_t hidden = dims[dims.size() - 1];
  const int64_t count = static_cast<int64_t>(x.element_count());
  const bool same = rmsnorm_operands_match(x, residual, weight, *normed, *new_residual, hidden);
  if (!same) {
    return ffi::Error::InvalidArgument(
        "jaxll: all_reduce_rmsnorm takes x, residual (x's shape) and weight (hidden,) of one "
        "element type, and returns two arrays of x's shape");
  }
  if (count == 0) return ffi::Error::Success();
  if (const char* problem = rmsnorm_unsupported(dtype, hidden, r->view)) {
    return ffi::Error::InvalidArgument(std::string("jaxll: all_reduce_rmsnorm kernel: unsupported ") +
                                       problem);
  }
  if (ffi::Error e = use_device(ordinal); e.failure()) return e;
  cudaError_t e = launch_all_reduce_rmsnorm(dtype, r->view, x.untyped_data(), residual.untyped_data(),
                                            weight.untyped_data(), normed->untyped_data(),
                                            new_residual->untyped_data(), count / hidden, hidden,
                                            eps, stream, protocol);
  if (e != cudaSuccess) return rmsnorm_launch_error(e, *c, "an all_reduce_rmsnorm of " + std::to_string(count) + " elements", protocol);
  return ffi::Error::Success();
}

// All-gather (collective 2) or reduce-scatter (3) over the workspace's group,
// pieces of `count` = the output's (gather: input's) element count over the
// group size; x and y of one element type; `order` as for jaxll_all_reduce.
ffi::Error GatherScatterExecute(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x,
                                ffi::AnyBuffer /*order*/, ffi::Result<ffi::AnyBuffer> y,
                                ffi::Result<ffi::AnyBuffer> /*order_out*/, int64_t workspace_id,
                                int64_t collective, int64_t algorithm) {
  const WorkspaceRef hold(workspace_id);
  Workspace* c = nullptr;
  Rank* r = nullptr;
  if (ffi::Error e = find_rank(hold, workspace_id, ordinal, &c, &r); e.failure()) return e;
  const Collective kind = static_cast<Collective>(collective);
  if (kind != Collective::kAllGather && kind != Collective::kReduceScatter) {
    return ffi::Error::InvalidArgument("jaxll: unknown collective code " + std::to_string(collective));
  }
  const bool gather = kind == Collective::kAllGather;
  DType dtype;
  if (ffi::Error e = to_dtype(x.element_type(), &dtype); e.failure()) return e;
  if (!has_gather_scatter_kernel(kind, static_cast<Algorithm>(algorithm), dtype)) {
    return ffi::Error::InvalidArgument("jaxll: no gather/scatter kernel for algorithm " +
                                       std::to_string(algorithm) + " and this element type");
  }
  const int64_t n = r->view.nranks;
  const int64_t in = static_cast<int64_t>(x.element_count());
  const int64_t out = static_cast<int64_t>(y->element_count());
  const int64_t count = gather ? in : out;
  if (y->element_type() != x.element_type() || (gather ? out != in * n : in != out * n)) {
    return ffi::Error::InvalidArgument(std::string("jaxll: ") + (gather ? "all_gather" : "psum_scatter") +
                                       " output must hold " + (gather ? "group size x" : "1 / group size of") +
                                       " its input's elements, of its type");
  }
  if (count == 0) return ffi::Error::Success();
  if (ffi::Error e = use_device(ordinal); e.failure()) return e;
  cudaError_t e = launch_gather_scatter(kind, static_cast<Algorithm>(algorithm), dtype, r->view,
                                        x.untyped_data(), y->untyped_data(), count, stream);
  if (e != cudaSuccess) {
    return launch_error(e, *c, std::string(gather ? "an all_gather" : "a psum_scatter") + " of pieces of " +
                                   std::to_string(count) + " elements",
                        true);  // (has_gather_scatter_kernel above)
  }
  return ffi::Error::Success();
}

// Launches one empty kernel; output aliases input.// Launches one empty kernel; output aliases input. A jitted chain of these is the
// per-call floor of any FFI custom call that launches a kernel.
ffi::Error NoopExecute(cudaStream_t stream, ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer>) {
  cudaError_t e = launch_empty(stream);
  if (e != cudaSuccess) return ffi::Error::Internal(cudaGetErrorString(e));
  return ffi::Error::Success();
}

// The join of the lowering's order chains (jaxll/lowering.py): its result
// depends on all its operands, and XLA keeps that dependency under every
// scheduler and command-buffer mode, unlike an optimization barrier, which it
// removes after scheduling. Nothing happens on the device: where the result
// stands for operand 0 it aliases it (the lowering asks for that), and an order
// value is never read.
ffi::Error JoinExecute(ffi::AnyBuffer, ffi::RemainingArgs, ffi::Result<ffi::AnyBuffer>) {
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxll

using jaxll::AllReduceExecute;
using jaxll::CheckExecute;
using jaxll::DeviceOrdinalExecute;
using jaxll::GatherScatterExecute;
using jaxll::JoinExecute;
using jaxll::NoopExecute;
using jaxll::RmsNormExecute;

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxll_all_reduce_handler, AllReduceExecute,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("workspace")
                                  .Attr<int64_t>("algorithm")
                                  .Attr<int64_t>("op"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxll_check_handler, CheckExecute,
                              ffi::Ffi::Bind()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<ffi::Span<const int64_t>>("workspaces"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxll_device_ordinal_handler, DeviceOrdinalExecute,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxll_noop_handler, NoopExecute,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>(),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxll_join_handler, JoinExecute,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>(),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxll_all_reduce_rmsnorm_handler, RmsNormExecute,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("workspace")
                                  .Attr<float>("eps")
                                  .Attr<int32_t>("protocol"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxll_gather_scatter_handler, GatherScatterExecute,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("workspace")
                                  .Attr<int64_t>("collective")
                                  .Attr<int64_t>("algorithm"),
                              {ffi::Traits::kCmdBufferCompatible});
