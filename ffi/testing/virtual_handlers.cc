// XLA FFI handlers of jaxll.testing's jittable virtual-rank calls (test tools:
// they run on the runtime's workspaces, and the bindings register them).
//
//   jaxll_virtual_all_reduce  N virtual ranks on one GPU: input (N, ...) is
//                             reduced across its leading axis, one stream per rank
//                             (or, with attribute one_launch=1, every rank in one
//                             launch on XLA's stream)
//   jaxll_virtual_all_reduce_rmsnorm
//                             the fused kernel on N virtual ranks (operands and
//                             results (N, ..., hidden) but weight (hidden,))
//   ..._graph                 twins of the two that XLA may capture into command
//                             buffers (for benchmarks)
#include "virtual_handlers.h"

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "../kernels/all_reduce.h"
#include "../runtime/ffi_common.h"
#include "../runtime/workspace.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxll {
namespace {

using namespace handlers;

// The virtual-rank workspace `workspace_id` on device `ordinal`, unless it is gone,
// lives elsewhere or a rank of it has recorded an error.
ffi::Error find_virtual(const WorkspaceRef& hold, int64_t workspace_id, int32_t ordinal,
                        Workspace** out) {
  Workspace* c = hold.get();
  if (c == nullptr || !c->virtual_ranks()) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jaxll: virtual-rank workspace " + std::to_string(workspace_id) +
                          " does not exist (freed?)");
  }
  if (c->rank(0, 0).ordinal != ordinal) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jaxll: virtual-rank workspace " + std::to_string(workspace_id) +
                          " lives on CUDA device " + std::to_string(c->rank(0, 0).ordinal) +
                          " but the call runs on device " + std::to_string(ordinal));
  }
  for (int i = 0; i < c->group_size(); ++i) {
    if (uint64_t word = c->error_word(c->rank(0, i))) {
      return ffi::Error(ffi::ErrorCode::kAborted, c->describe_error(c->rank(0, i), word));
    }
  }
  *out = c;
  return ffi::Error::Success();
}

// Forks `stream` onto every virtual rank's stream (but `skip_rank`), runs
// `launch(i, rank)` there and joins the ranks back into `stream`; the same
// fork and join under stream capture (a command buffer) as outside it.
template <class Launch>
cudaError_t fork_ranks(Workspace& c, cudaStream_t stream, int64_t skip_rank, Launch&& launch) {
  cudaError_t e = cudaEventRecord(c.fork_event(), stream);
  for (int i = 0; i < c.group_size() && e == cudaSuccess; ++i) {
    if (i == skip_rank) continue;
    Rank& r = c.rank(0, i);
    e = cudaStreamWaitEvent(r.stream, c.fork_event(), 0);
    if (e == cudaSuccess) e = launch(i, r);
    if (e == cudaSuccess) e = cudaEventRecord(r.done, r.stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(stream, r.done, 0);
  }
  return e;
}

// `one_launch` (both virtual handlers): 0 forks the call onto the ranks'
// streams, a kernel each (fork_ranks); 1 runs every rank's call as one launch
// on `stream` (launch_all_reduce_group: one graph node instead of a fork, N
// kernels and a join; every rank starts together, so use 0 to test ranks that
// drift apart).
ffi::Error VirtualAllReduceExecute(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x,
                                   ffi::Result<ffi::AnyBuffer> y, int64_t workspace_id,
                                   int64_t algorithm, int64_t op, int64_t skip_rank,
                                   int64_t one_launch) {
  Workspace* c = nullptr;
  const WorkspaceRef hold(workspace_id);
  if (ffi::Error e = find_virtual(hold, workspace_id, ordinal, &c); e.failure()) return e;
  const int n = c->group_size();
  if (ffi::Error e = check_call(algorithm, op); e.failure()) return e;
  DType dtype;
  if (ffi::Error e = to_dtype(x.element_type(), &dtype); e.failure()) return e;
  const auto dims = x.dimensions();
  if (dims.size() < 1 || dims[0] != n) {
    return ffi::Error::InvalidArgument("jaxll: virtual all-reduce input must have leading axis " +
                                       std::to_string(n) + " (one row per virtual rank)");
  }
  if (y->element_count() != x.element_count()) {
    return ffi::Error::InvalidArgument("jaxll: virtual all-reduce output must match its input");
  }
  const int64_t count = static_cast<int64_t>(x.element_count()) / n;
  if (count == 0) return ffi::Error::Success();
  const size_t row_bytes = static_cast<size_t>(count) * dtype_bytes(dtype);
  if (one_launch && skip_rank >= 0 && skip_rank < n) {
    return ffi::Error::InvalidArgument("jaxll: a virtual all-reduce in one launch runs every rank "
                                       "(skip_rank needs one_launch=0)");
  }
  if (ffi::Error e = use_device(ordinal); e.failure()) return e;
  cudaError_t e = cudaSuccess;
  if (one_launch) {
    const std::vector<RankView> views = c->views(0);
    std::vector<const void*> in(n);
    std::vector<void*> out(n);
    for (int i = 0; i < n; ++i) {
      in[i] = static_cast<const char*>(x.untyped_data()) + i * row_bytes;
      out[i] = static_cast<char*>(y->untyped_data()) + i * row_bytes;
    }
    e = launch_all_reduce_group(static_cast<Algorithm>(algorithm), dtype, static_cast<ReduceOp>(op),
                                views.data(), n, in.data(), out.data(), count, stream);
  } else {
    e = fork_ranks(*c, stream, skip_rank, [&](int i, Rank& r) {
      return launch_all_reduce(static_cast<Algorithm>(algorithm), dtype, static_cast<ReduceOp>(op),
                               r.view, static_cast<const char*>(x.untyped_data()) + i * row_bytes,
                               static_cast<char*>(y->untyped_data()) + i * row_bytes, count, r.stream);
    });
  }
  if (e != cudaSuccess) {
    return launch_error(e, *c, "a virtual all-reduce of " + std::to_string(count) + " elements per rank",
                        has_kernel(static_cast<Algorithm>(algorithm), dtype, static_cast<ReduceOp>(op)));
  }
  return ffi::Error::Success();
}

// The fused all-reduce + residual + RMSNorm on N virtual ranks: x, residual,
// normed and new_residual are (N, ..., hidden), row i rank i's; weight (hidden,)
// is every rank's; one element type.
ffi::Error VirtualRmsNormExecute(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x,
                                 ffi::AnyBuffer residual, ffi::AnyBuffer weight,
                                 ffi::Result<ffi::AnyBuffer> normed,
                                 ffi::Result<ffi::AnyBuffer> new_residual, int64_t workspace_id,
                                 float eps, int32_t protocol_code, int64_t one_launch) {
  Workspace* c = nullptr;
  const WorkspaceRef hold(workspace_id);
  if (ffi::Error e = find_virtual(hold, workspace_id, ordinal, &c); e.failure()) return e;
  RmsNormProtocol protocol;
  if (ffi::Error e = to_rmsnorm_protocol(protocol_code, &protocol); e.failure()) return e;
  const int n = c->group_size();
  DType dtype;
  if (ffi::Error e = to_dtype(x.element_type(), &dtype); e.failure()) return e;
  const auto dims = x.dimensions();
  const int64_t count = static_cast<int64_t>(x.element_count());
  const int64_t hidden = dims.size() >= 2 ? dims[dims.size() - 1] : 0;
  const bool same = dims.size() >= 2 && dims[0] == n &&
                    rmsnorm_operands_match(x, residual, weight, *normed, *new_residual, hidden);
  if (!same) {
    return ffi::Error::InvalidArgument(
        "jaxll: the virtual all_reduce_rmsnorm takes x and residual of shape (" +
        std::to_string(n) + ", ..., hidden) and weight (hidden,) of one element type");
  }
  if (count == 0) return ffi::Error::Success();
  if (const char* problem = rmsnorm_unsupported(dtype, hidden, c->rank(0, 0).view)) {
    return ffi::Error::InvalidArgument(std::string("jaxll: all_reduce_rmsnorm kernel: unsupported ") +
                                       problem);
  }
  const int64_t per_rank = count / n;
  const size_t row_bytes = static_cast<size_t>(per_rank) * dtype_bytes(dtype);
  if (ffi::Error e = use_device(ordinal); e.failure()) return e;
  auto at = [&](const void* base, int i) { return static_cast<const char*>(base) + i * row_bytes; };
  auto out_at = [&](void* base, int i) { return static_cast<char*>(base) + i * row_bytes; };
  cudaError_t e = cudaSuccess;
  if (one_launch) {
    const std::vector<RankView> views = c->views(0);
    std::vector<RmsNormOperands> ops(n);
    for (int i = 0; i < n; ++i) {
      ops[i] = {at(x.untyped_data(), i), at(residual.untyped_data(), i), weight.untyped_data(),
                out_at(normed->untyped_data(), i), out_at(new_residual->untyped_data(), i)};
    }
    e = launch_all_reduce_rmsnorm_group(dtype, views.data(), n, ops.data(), per_rank / hidden,
                                        hidden, eps, stream, protocol);
  } else {
    e = fork_ranks(*c, stream, -1, [&](int i, Rank& r) {
      return launch_all_reduce_rmsnorm(dtype, r.view, at(x.untyped_data(), i),
                                       at(residual.untyped_data(), i), weight.untyped_data(),
                                       out_at(normed->untyped_data(), i),
                                       out_at(new_residual->untyped_data(), i), per_rank / hidden,
                                       hidden, eps, r.stream, protocol);
    });
  }
  if (e != cudaSuccess) return rmsnorm_launch_error(e, *c, "a virtual all_reduce_rmsnorm of " + std::to_string(per_rank) + " elements per rank", protocol);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxll

using jaxll::VirtualAllReduceExecute;
using jaxll::VirtualRmsNormExecute;

#define JAXLL_VIRTUAL_ALL_REDUCE_BINDING                 \
  ffi::Ffi::Bind()                                       \
      .Ctx<ffi::PlatformStream<cudaStream_t>>()          \
      .Ctx<ffi::DeviceOrdinal>()                         \
      .Arg<ffi::AnyBuffer>()                             \
      .Ret<ffi::AnyBuffer>()                             \
      .Attr<int64_t>("workspace")                             \
      .Attr<int64_t>("algorithm")                        \
      .Attr<int64_t>("op")                               \
      .Attr<int64_t>("skip_rank")                        \
      .Attr<int64_t>("one_launch")
#define JAXLL_VIRTUAL_RMSNORM_BINDING                    \
  ffi::Ffi::Bind()                                       \
      .Ctx<ffi::PlatformStream<cudaStream_t>>()          \
      .Ctx<ffi::DeviceOrdinal>()                         \
      .Arg<ffi::AnyBuffer>()                             \
      .Arg<ffi::AnyBuffer>()                             \
      .Arg<ffi::AnyBuffer>()                             \
      .Ret<ffi::AnyBuffer>()                             \
      .Ret<ffi::AnyBuffer>()                             \
      .Attr<int64_t>("workspace")                             \
      .Attr<float>("eps")                                \
      .Attr<int32_t>("protocol")                         \
      .Attr<int64_t>("one_launch")

// The virtual-rank handlers, each twice: outside command buffers (the host
// checks the ranks' error words at every run), and as a twin XLA may capture
// into a command buffer (checked only when captured; for benchmarks, whose
// host would otherwise be slower than the ranks' kernels).
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxll_virtual_all_reduce_handler, VirtualAllReduceExecute,
                              JAXLL_VIRTUAL_ALL_REDUCE_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxll_virtual_all_reduce_graph_handler, VirtualAllReduceExecute,
                              JAXLL_VIRTUAL_ALL_REDUCE_BINDING, {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxll_virtual_all_reduce_rmsnorm_handler, VirtualRmsNormExecute,
                              JAXLL_VIRTUAL_RMSNORM_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(jaxll_virtual_all_reduce_rmsnorm_graph_handler, VirtualRmsNormExecute,
                              JAXLL_VIRTUAL_RMSNORM_BINDING, {ffi::Traits::kCmdBufferCompatible});

