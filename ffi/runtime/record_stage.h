// XLA FFI's record stage (jaxlib 0.12's headers and newer): how a jaxll call becomes a
// kernel node of XLA's command buffer (CUDA graph) instead of a stream capture.
//
// Without it XLA captures the execute handler's launch into a graph of its own
// and adds that as a child-graph node joined by plain edges, so the kernel can
// never start while the kernel ahead of it finishes. With it, the handler runs
// the execute handler's checks and plan under a LaunchCapture and hands the one
// launch to XLA (create_launch); XLA adds a kernel node and, where the call's
// attribute `uses_pdl` is true, XLA's --xla_gpu_enable_pdl is on and the launch
// itself may start early (launches_early), joins it to the kernel nodes ahead
// of it by programmatic edges. A call XLA records again (its buffers moved)
// updates the node's arguments.
//
// JAXLL_RECORD_STAGE is 1 where the FFI headers have the stage as jaxlib 0.12.1
// shapes it (FFI API 0.5 with kernel_api.h; jaxlib 0.12.0's differs).
#pragma once

#include <cuda_runtime.h>

#include <initializer_list>

#include "kernels/launch.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

#if XLA_FFI_API_MAJOR == 0 && XLA_FFI_API_MINOR >= 5 && __has_include("xla/ffi/api/record_api.h") && \
    __has_include("xla/ffi/api/kernel_api.h")
#define JAXLL_RECORD_STAGE 1
#define JAXLL_RECORD_HANDLER(handler) (handler)
#include "xla/ffi/api/record_api.h"
#else
#define JAXLL_RECORD_STAGE 0
#define JAXLL_RECORD_HANDLER(handler) nullptr
#endif

#if JAXLL_RECORD_STAGE
namespace jaxll {

using RecordContext = xla::ffi::internal::RecordContextBase<xla::ffi::internal::ErrorPolicy>;
struct RecordExtension : xla::ffi::internal::RecordExtensionBase<RecordContext> {};
using RecordCtx = xla::ffi::Extension<RecordExtension>;

// The record stage of a call whose execute handler is `execute(stream)`: runs
// it with its launch captured, then creates (or updates) the kernel node. Where
// there is no one kernel node to make or update (the call launches nothing, the
// capture refused its launch, XLA will not take the launch, or an earlier
// record of the call fell back), the call falls back to stream capture: XLA
// runs the execute handler on its capture stream, as without this stage.
template <class Execute>
xla::ffi::Error record_call(RecordContext ctx, Execute&& execute) {
  LaunchCapture capture;
  xla::ffi::Error e = execute(cudaStream_t{nullptr});
  if (capture.refused()) return ctx.RequestStreamCapture();
  if (e.failure()) return e;
  const CapturedLaunch* l = capture.launch();
  if (l == nullptr) return ctx.RequestStreamCapture();
  const xla::ffi::KernelArg arg = xla::ffi::HostValue{l->args, l->args_bytes};
  if (ctx.action() == xla::ffi::RecordAction::kUpdate) {
    const xla::ffi::BoundedCommandVector nodes = ctx.commands();
    if (nodes.size() != 1) return ctx.RequestStreamCapture();
    return ctx.UpdateLaunch(nodes[0], std::initializer_list<xla::ffi::KernelArg>{arg});
  }
  const cudaFunction_t fn = kernel_handle(l->fn);
  if (fn == nullptr) return ctx.RequestStreamCapture();
  const int32_t c = l->cluster > 1 ? l->cluster : 0;
  const XLA_FFI_LaunchDims dims{{static_cast<int32_t>(l->blocks), 1, 1},
                               {l->threads, 1, 1},
                               {c, c ? 1 : 0, c ? 1 : 0}};
  auto node = ctx.CreateLaunch("jaxll collective", reinterpret_cast<void*>(fn), dims,
                               /*shared_mem_bytes=*/0, l->pdl,
                               std::initializer_list<xla::ffi::KernelArg>{arg});
  if (node.has_error()) return ctx.RequestStreamCapture();
  return xla::ffi::Error::Success();
}

}  // namespace jaxll
#endif  // JAXLL_RECORD_STAGE
