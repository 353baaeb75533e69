// XLA FFI handlers of the tools' jittable virtual-rank calls:
//
//   jaxll_virtual_all_reduce  N virtual ranks on one GPU: input (N, ...) is
//                             reduced across its leading axis, one stream per rank
//                             (or, with attribute one_launch=1, every rank in one
//                             launch on XLA's stream)
//   jaxll_virtual_all_reduce_rmsnorm
//                             the fused kernel on N virtual ranks (operands and
//                             results (N, ..., hidden) but weight (hidden,))
//   ..._graph                 twins of the two that XLA may capture into command
//                             buffers (for benchmarks: the ranks' recorded errors
//                             are then checked only when captured)
#include <cuda_runtime.h>

#include <exception>
#include <string>
#include <vector>

#include "kernels/all_reduce.h"
#include "kernels/rmsnorm.h"
#include "runtime/ffi_support.h"
#include "kernels/group_launch.h"
#include "runtime/handler_table.h"
#include "testing/virtual_group.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jaxll {
namespace {

// The tools' group of virtual-rank workspace `workspace_id`, with fresh views,
// unless it is gone, lives on another device or a rank recorded an error.
ffi::Error find_virtual(int64_t workspace_id, int32_t ordinal, VirtualGroup** out) {
  VirtualGroup* g = find_group(workspace_id);
  if (g == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jaxll: no virtual-rank workspace " + std::to_string(workspace_id) +
                          " (jaxll.tools.testing attaches one as it builds it)");
  }
  if (g->ordinal() != ordinal) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jaxll: virtual-rank workspace " + std::to_string(workspace_id) +
                          " lives on CUDA device " + std::to_string(g->ordinal()) +
                          " but the call runs on device " + std::to_string(ordinal));
  }
  try {
    const std::string error = g->refresh();
    if (!error.empty()) return ffi::Error(ffi::ErrorCode::kAborted, error);
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition, e.what());
  }
  *out = g;
  return ffi::Error::Success();
}

// Forks `stream` onto every virtual rank's stream (but `skip_rank`), runs
// `launch(i, rank)` there and joins the ranks back into `stream`; the same
// fork and join under stream capture (a command buffer) as outside it.
template <class Launch>
Status fork_ranks(VirtualGroup& g, cudaStream_t stream, int64_t skip_rank, Launch&& launch) {
  Status s = Status::Cuda(cudaEventRecord(g.fork_event(), stream));
  for (int i = 0; i < g.size() && s.ok(); ++i) {
    if (i == skip_rank) continue;
    VirtualRank& r = g.rank(i);
    s = Status::Cuda(cudaStreamWaitEvent(r.stream, g.fork_event(), 0));
    if (s.ok()) s = launch(i, r);
    if (s.ok()) s = Status::Cuda(cudaEventRecord(r.done, r.stream));
    if (s.ok()) s = Status::Cuda(cudaStreamWaitEvent(stream, r.done, 0));
  }
  return s;
}

// `one_launch`: 0 forks the call onto the ranks' streams, a kernel each; 1 runs
// every rank's call as one launch on `stream` (every rank starts together, so
// use 0 to test ranks that drift apart).
ffi::Error VirtualAllReduceExecute(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x,
                                   ffi::Result<ffi::AnyBuffer> y, int64_t workspace_id,
                                   int64_t algorithm, int64_t op, int64_t skip_rank,
                                   int64_t one_launch) {
  VirtualGroup* g = nullptr;
  if (ffi::Error e = find_virtual(workspace_id, ordinal, &g); e.failure()) return e;
  const int n = g->size();
  if (algorithm < 1 || algorithm > kLastAlgorithm || op < 0 || op > static_cast<int64_t>(ReduceOp::kMin)) {
    return ffi::Error::InvalidArgument("jaxll: unknown algorithm or reduction code");
  }
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
  const auto a = static_cast<Algorithm>(algorithm);
  const auto o = static_cast<ReduceOp>(op);
  const char* in = static_cast<const char*>(x.untyped_data());
  char* out = static_cast<char*>(y->untyped_data());
  Status s = Status::Ok();
  if (one_launch) {
    const std::vector<RankView> views = g->views();
    std::vector<const void*> ins(n);
    std::vector<void*> outs(n);
    for (int i = 0; i < n; ++i) {
      ins[i] = in + i * row_bytes;
      outs[i] = out + i * row_bytes;
    }
    s = launch_all_reduce_group(a, dtype, o, views.data(), n, ins.data(), outs.data(), count, stream);
  } else {
    s = fork_ranks(*g, stream, skip_rank, [&](int i, VirtualRank& r) {
      return launch_all_reduce(a, dtype, o, r.view, in + i * row_bytes, out + i * row_bytes, count,
                               r.stream);
    });
  }
  return status_error(s, "a virtual all-reduce of " + std::to_string(count) + " elements per rank",
                      workspace_id);
}

// The fused all-reduce + residual + RMSNorm on N virtual ranks: x, residual,
// normed and new_residual are (N, ..., hidden), row i rank i's; weight (hidden,)
// is every rank's; one element type.
ffi::Error VirtualRmsNormExecute(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x,
                                 ffi::AnyBuffer residual, ffi::AnyBuffer weight,
                                 ffi::Result<ffi::AnyBuffer> normed,
                                 ffi::Result<ffi::AnyBuffer> new_residual, int64_t workspace_id,
                                 float eps, int32_t protocol_code, int64_t one_launch) {
  VirtualGroup* g = nullptr;
  if (ffi::Error e = find_virtual(workspace_id, ordinal, &g); e.failure()) return e;
  RmsNormProtocol protocol;
  if (ffi::Error e = to_rmsnorm_protocol(protocol_code, &protocol); e.failure()) return e;
  const int n = g->size();
  DType dtype;
  if (ffi::Error e = to_dtype(x.element_type(), &dtype); e.failure()) return e;
  const auto dims = x.dimensions();
  const int64_t count = static_cast<int64_t>(x.element_count());
  const int64_t hidden = dims.size() >= 2 ? dims[dims.size() - 1] : 0;
  if (dims.size() < 2 || dims[0] != n ||
      !rmsnorm_operands_match(x, residual, weight, *normed, *new_residual, hidden)) {
    return ffi::Error::InvalidArgument(
        "jaxll: the virtual all_reduce_rmsnorm takes x and residual of shape (" +
        std::to_string(n) + ", ..., hidden) and weight (hidden,) of one element type");
  }
  if (count == 0) return ffi::Error::Success();
  if (const char* problem = rmsnorm_unsupported(dtype, hidden, g->rank(0).view)) {
    return ffi::Error::InvalidArgument(std::string("jaxll: all_reduce_rmsnorm kernel: unsupported ") +
                                       problem);
  }
  const int64_t per_rank = count / n;
  const size_t row_bytes = static_cast<size_t>(per_rank) * dtype_bytes(dtype);
  if (ffi::Error e = use_device(ordinal); e.failure()) return e;
  auto at = [&](const void* base, int i) { return static_cast<const char*>(base) + i * row_bytes; };
  auto out_at = [&](void* base, int i) { return static_cast<char*>(base) + i * row_bytes; };
  Status s = Status::Ok();
  if (one_launch) {
    const std::vector<RankView> views = g->views();
    std::vector<RmsNormOperands> ops(n);
    for (int i = 0; i < n; ++i) {
      ops[i] = {at(x.untyped_data(), i), at(residual.untyped_data(), i), weight.untyped_data(),
                out_at(normed->untyped_data(), i), out_at(new_residual->untyped_data(), i)};
    }
    s = launch_all_reduce_rmsnorm_group(dtype, views.data(), n, ops.data(), per_rank / hidden,
                                        hidden, eps, protocol, stream);
  } else {
    s = fork_ranks(*g, stream, -1, [&](int i, VirtualRank& r) {
      return launch_all_reduce_rmsnorm(dtype, r.view, at(x.untyped_data(), i),
                                       at(residual.untyped_data(), i), weight.untyped_data(),
                                       out_at(normed->untyped_data(), i),
                                       out_at(new_residual->untyped_data(), i), per_rank / hidden,
                                       hidden, eps, protocol, r.stream);
    });
  }
  return rmsnorm_status_error(
      s, "a virtual all_reduce_rmsnorm of " + std::to_string(per_rank) + " elements per rank",
      workspace_id, protocol);
}

#define JAXLL_VIRTUAL_ALL_REDUCE_BINDING        \
  ffi::Ffi::Bind()                              \
      .Ctx<ffi::PlatformStream<cudaStream_t>>() \
      .Ctx<ffi::DeviceOrdinal>()                \
      .Arg<ffi::AnyBuffer>()                    \
      .Ret<ffi::AnyBuffer>()                    \
      .Attr<int64_t>("workspace")               \
      .Attr<int64_t>("algorithm")               \
      .Attr<int64_t>("op")                      \
      .Attr<int64_t>("skip_rank")               \
      .Attr<int64_t>("one_launch")
#define JAXLL_VIRTUAL_RMSNORM_BINDING           \
  ffi::Ffi::Bind()                              \
      .Ctx<ffi::PlatformStream<cudaStream_t>>() \
      .Ctx<ffi::DeviceOrdinal>()                \
      .Arg<ffi::AnyBuffer>()                    \
      .Arg<ffi::AnyBuffer>()                    \
      .Arg<ffi::AnyBuffer>()                    \
      .Ret<ffi::AnyBuffer>()                    \
      .Ret<ffi::AnyBuffer>()                    \
      .Attr<int64_t>("workspace")               \
      .Attr<float>("eps")                       \
      .Attr<int32_t>("protocol")                \
      .Attr<int64_t>("one_launch")

XLA_FFI_DEFINE_HANDLER(kVirtualAllReduce, VirtualAllReduceExecute, JAXLL_VIRTUAL_ALL_REDUCE_BINDING);
XLA_FFI_DEFINE_HANDLER(kVirtualAllReduceGraph, VirtualAllReduceExecute,
                       JAXLL_VIRTUAL_ALL_REDUCE_BINDING, {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER(kVirtualRmsNorm, VirtualRmsNormExecute, JAXLL_VIRTUAL_RMSNORM_BINDING);
XLA_FFI_DEFINE_HANDLER(kVirtualRmsNormGraph, VirtualRmsNormExecute, JAXLL_VIRTUAL_RMSNORM_BINDING,
                       {ffi::Traits::kCmdBufferCompatible});

}  // namespace

void add_virtual_handlers(HandlerTable& handlers) {
  handlers.add("jaxll_virtual_all_reduce", kVirtualAllReduce, false);
  handlers.add("jaxll_virtual_all_reduce_graph", kVirtualAllReduceGraph, true);
  handlers.add("jaxll_virtual_all_reduce_rmsnorm", kVirtualRmsNorm, false);
  handlers.add("jaxll_virtual_all_reduce_rmsnorm_graph", kVirtualRmsNormGraph, true);
}

}  // namespace jaxll
