// The Python extension module jaxll.tools._jaxll_testing: jaxll's testing tools
// (virtual ranks, speed-of-light probes) over the runtime's workspaces, which
// it reaches only through the extension API, as an extension outside jaxll
// would. It launches the collective kernels through the kernel library it
// shares with the runtime (kernels/kernels.h), and its own drivers' kernels
// itself.
#include <nanobind/nanobind.h>

#include <stdexcept>
#include <string>

#include "testing/testing_bindings.h"
#include "testing/tool_kernels.h"
#include "testing/virtual_group.h"

namespace nb = nanobind;
using namespace nb::literals;

NB_MODULE(_jaxll_testing, m) {
  m.doc() = "jaxll's testing tools: virtual ranks and speed-of-light probes";
  static jaxll::HandlerTable handlers;
  jaxll::add_virtual_handlers(handlers);
  jaxll::bind_drivers(m);
  m.def("handlers", [] { return handlers.as_dict(); },
        "XLA FFI handlers by target name: (capsule, whether XLA may capture it into a command "
        "buffer, None: no record stage).");
  m.def("init", [](nb::capsule api) {
    const auto* table = static_cast<const jaxll::ExtensionApi*>(api.data("jaxll.extension_api"));
    if (table->version != jaxll::kExtensionApiVersion ||
        table->rank_view_bytes != sizeof(jaxll::RankView)) {
      throw std::runtime_error("jaxll's testing module and runtime come from different builds");
    }
    jaxll::set_extension_api(table);
    char error[512] = {0};
    if (table->register_loader(&jaxll::load_tool_kernels, error, sizeof(error)) != jaxll::kExtensionOk) {
      throw std::runtime_error(error);
    }
  }, "api"_a, "Takes the runtime's extension API (jaxll.extension.api()) and registers the "
              "module's kernels with it.");
  m.def("attach", [](int64_t workspace, int ordinal, int nranks) {
    jaxll::attach_group(workspace, ordinal, nranks);
  }, "workspace"_a, "ordinal"_a, "nranks"_a,
        "Takes a virtual-rank workspace for the tools (its ranks' streams are made here).");
  m.def("block_bound", [](int ordinal, int carveout) {
    nb::gil_scoped_release release;
    return jaxll::tool_block_bound(ordinal, carveout);
  }, "ordinal"_a, "carveout"_a,
        "Most co-resident blocks of the module's collective kernels (their group twins too).");
}
