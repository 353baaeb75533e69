// The extension module custom_collective._broadcast: the XLA FFI handler of
// "custom_broadcast" and init(), which takes jaxll's extension API table.
#include <nanobind/nanobind.h>

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "broadcast_kernel.h"
#include "jaxll/extension.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;

namespace custom_collective {
namespace {

const jaxll::ExtensionApi* g_api = nullptr;

// operands: x, order (jaxll's 4-byte order buffer, never touched);
// results: y, order; attributes: comm (the workspace id), root
ffi::Error BroadcastExecute(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x,
                            ffi::AnyBuffer /*order*/, ffi::Result<ffi::AnyBuffer> y,
                            ffi::Result<ffi::AnyBuffer> /*order_out*/, int64_t comm,
                            int64_t root) {
  if (g_api == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "custom_broadcast: init(jaxll.extension.api()) was not called");
  }
  jaxll::RankView view;
  char error[512];
  const int status = g_api->get_rank_view(comm, ordinal, &view, error, sizeof(error));
  if (status != jaxll::kExtensionOk) {
    return ffi::Error(status == jaxll::kExtensionHasError ? ffi::ErrorCode::kAborted
                                                          : ffi::ErrorCode::kFailedPrecondition,
                      error);
  }
  if (y->size_bytes() != x.size_bytes()) {
    return ffi::Error::InvalidArgument("custom_broadcast: output must match the input");
  }
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != ordinal) cudaSetDevice(ordinal);
  const cudaError_t e = launch_broadcast(view, x.untyped_data(), y->untyped_data(),
                                         static_cast<int64_t>(x.size_bytes()),
                                         static_cast<int>(root), stream);
  if (e != cudaSuccess) {
    return ffi::Error::Internal(std::string("custom_broadcast: launch failed: ") +
                                cudaGetErrorString(e));
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace custom_collective

XLA_FFI_DEFINE_HANDLER_SYMBOL(custom_broadcast_handler, custom_collective::BroadcastExecute,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("root"));

NB_MODULE(_broadcast, m) {
  m.def("init", [](nb::capsule api) {
    if (std::string(api.name()) != "jaxll.extension_api") {
      throw std::invalid_argument("init() takes jaxll.extension.api()");
    }
    const auto* table = static_cast<const jaxll::ExtensionApi*>(api.data());
    if (table->version != jaxll::kExtensionApiVersion ||
        table->rank_view_bytes != sizeof(jaxll::RankView)) {
      throw std::runtime_error(
          "custom_collective was built against other jaxll headers (extension API version " +
          std::to_string(jaxll::kExtensionApiVersion) + ", RankView of " +
          std::to_string(sizeof(jaxll::RankView)) + " bytes; the installed jaxll has " +
          std::to_string(table->version) + " and " + std::to_string(table->rank_view_bytes) +
          "): rebuild it");
    }
    custom_collective::g_api = table;
  }, nb::arg("api"));
  m.def("handler", [] {
    return nb::capsule(reinterpret_cast<void*>(&custom_broadcast_handler));
  });
}
