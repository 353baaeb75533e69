// A runtime layer, the Python extension module jaxll._runtime_ffi_<major>_<minor>:
// every part of the runtime binds itself (bindings.h) and lists its XLA FFI
// handlers in one table. CMakeLists.txt builds one layer per XLA FFI header
// version it compiles against (the module's name says which), all over the one
// kernel library; jaxll/native.py imports the newest the installed jaxlib takes.
#include <nanobind/nanobind.h>

#include <cuda_runtime.h>

#include "runtime/bindings.h"
#include "runtime/record_stage.h"
#include "xla/ffi/api/c_api.h"

#if !defined(JAXLL_BUILT_JAXLIB_VERSION) || !defined(JAXLL_MODULE_NAME)
#error "JAXLL_BUILT_JAXLIB_VERSION and JAXLL_MODULE_NAME must be defined by the build"
#endif

NB_MODULE(JAXLL_MODULE_NAME, m) {
  namespace nb = nanobind;
  m.doc() = "jaxll's runtime: XLA FFI handlers, symmetric workspaces, the extension API";
  m.attr("built_jaxlib_version") = JAXLL_BUILT_JAXLIB_VERSION;
  m.attr("ffi_api_version") = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
  m.attr("built_cuda_version") = CUDART_VERSION;

  static jaxll::HandlerTable handlers;
  jaxll::bind_all_reduce(m, handlers);
  jaxll::bind_all_reduce_rmsnorm(m, handlers);
  jaxll::bind_gather_scatter(m, handlers);
  jaxll::bind_exchange(m, handlers);
  jaxll::bind_ragged_all_to_all(m, handlers);
  jaxll::bind_program_ops(m, handlers);
  jaxll::bind_workspaces(m);
  jaxll::bind_devices(m);
  jaxll::bind_codes(m);
  m.def("handlers", [] { return handlers.as_dict(); },
        "XLA FFI handlers by target name: (capsule, whether XLA may capture it into a command "
        "buffer, record-stage capsule or None).");
  m.attr("record_stage") = static_cast<bool>(JAXLL_RECORD_STAGE);
}
