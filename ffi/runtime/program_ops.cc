// The ops a jitted program with jaxll calls carries besides the collectives:
//
//   jaxll_check           host-only (never in a command buffer): fails the
//                         program with the recorded error when a workspace it
//                         uses has one, or was freed (src/jaxll/ordering.py)
//   jaxll_join            does nothing: joins the lowering's order chains across
//                         loops, branches and functions (jaxll/ordering.py)
//   jaxll_noop            launches one empty kernel: the per-call floor of a
//                         custom call that launches a kernel (the benchmarks)
//   jaxll_device_ordinal  writes the device ordinal XLA passes to handlers (the
//                         tests check it against Device.local_hardware_id)
#include <nanobind/nanobind.h>

#include <string>

#include "kernels/utility.h"
#include "runtime/bindings.h"
#include "runtime/ffi_support.h"
#include "runtime/registry.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
namespace nb = nanobind;

namespace jaxll {
namespace {

// Runs on the host each time XLA runs the program (it has no command-buffer
// trait, so XLA never records it). Reads only host memory. `order_out` is the
// first link of the program's order chain; never written.
ffi::Error CheckExecute(ffi::Result<ffi::AnyBuffer> /*order_out*/,
                        ffi::Span<const int64_t> workspaces) {
  for (int64_t id : workspaces) {
    const WorkspaceRef hold(id);
    Workspace* c = hold.get();
    if (c == nullptr) {
      return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                        "jaxll: workspace " + std::to_string(id) +
                            " was freed (jaxll.free_workspaces()) after this program was "
                            "compiled; compile it again (jax.clear_caches() or a new jax.jit)");
    }
    const std::string error = c->first_error();
    if (!error.empty()) return ffi::Error(ffi::ErrorCode::kAborted, error);
  }
  return ffi::Error::Success();
}

// Its result depends on all its operands, and XLA keeps that dependency under
// every scheduler and command-buffer mode, unlike an optimization barrier,
// which it removes after scheduling. Nothing happens on the device: where the
// result stands for operand 0 it aliases it (the lowering asks for that), and
// an order value is never read.
ffi::Error JoinExecute(ffi::AnyBuffer, ffi::RemainingArgs, ffi::Result<ffi::AnyBuffer>) {
  return ffi::Error::Success();
}

// Output aliases input.
ffi::Error NoopExecute(cudaStream_t stream, ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer>) {
  const Status s = launch_empty(stream);
  return s.ok() ? ffi::Error::Success() : ffi::Error::Internal("jaxll: " + s.describe());
}

ffi::Error DeviceOrdinalExecute(cudaStream_t stream, int32_t ordinal,
                                ffi::Result<ffi::Buffer<ffi::S32>> out) {
  if (out->element_count() != 1) return ffi::Error::InvalidArgument("expects a scalar output");
  const Status s = launch_fill_i32(out->typed_data(), ordinal, stream);
  return s.ok() ? ffi::Error::Success() : ffi::Error::Internal("jaxll: " + s.describe());
}

XLA_FFI_DEFINE_HANDLER(kCheckHandler, CheckExecute,
                       ffi::Ffi::Bind()
                           .Ret<ffi::AnyBuffer>()
                           .Attr<ffi::Span<const int64_t>>("workspaces"));
XLA_FFI_DEFINE_HANDLER(kJoinHandler, JoinExecute,
                       ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().RemainingArgs().Ret<ffi::AnyBuffer>(),
                       {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER(kNoopHandler, NoopExecute,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<cudaStream_t>>()
                           .Arg<ffi::AnyBuffer>()
                           .Ret<ffi::AnyBuffer>(),
                       {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER(kDeviceOrdinalHandler, DeviceOrdinalExecute,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<cudaStream_t>>()
                           .Ctx<ffi::DeviceOrdinal>()
                           .Ret<ffi::Buffer<ffi::S32>>());

}  // namespace

void bind_program_ops(nb::module_&, HandlerTable& handlers) {
  handlers.add("jaxll_check", kCheckHandler, false);
  handlers.add("jaxll_join", kJoinHandler, true);
  handlers.add("jaxll_noop", kNoopHandler, true);
  handlers.add("jaxll_device_ordinal", kDeviceOrdinalHandler, false);
}

}  // namespace jaxll
