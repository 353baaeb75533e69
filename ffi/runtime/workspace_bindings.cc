// The workspaces' bindings: build, connect across processes, describe, recover,
// free (jaxll/workspace.py and jaxll/distributed.py drive them).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/bindings.h"
#include "runtime/extension_api.h"
#include "runtime/registry.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace jaxll {
namespace {

// A hold on workspace `id` (keep it while using the workspace); throws if there is none.
WorkspaceRef workspace_or_throw(int64_t id) {
  WorkspaceRef hold(id);
  if (hold.get() == nullptr) {
    throw std::runtime_error("jaxll workspace " + std::to_string(id) + " does not exist");
  }
  return hold;
}

// Binds `name`(id): `op` on the workspace, without the GIL (it may wait for the devices).
template <class Op>
void def_workspace_op(nb::module_& m, const char* name, Op op, const char* doc) {
  m.def(name, [op](int64_t id) {
    const WorkspaceRef hold = workspace_or_throw(id);
    Workspace& c = *hold;
    nb::gil_scoped_release release;
    op(c);
  }, "id"_a, doc);
}

nb::dict info(const Workspace& c) {
  nb::dict d;
  d["id"] = c.id();
  d["virtual_ranks"] = c.virtual_ranks();
  d["group_count"] = c.group_count();
  d["group_size"] = c.group_size();
  d["round_bytes"] = c.round_bytes();
  d["bytes_per_rank"] = c.bytes_per_rank();
  d["region_bytes"] = c.geometry().region_bytes;
  d["max_blocks"] = c.max_blocks();
  d["scratch_bytes"] = c.config().scratch_bytes;
  d["timeout_ms"] = c.config().timeout_ms;
  nb::list groups;
  for (int g = 0; g < c.group_count(); ++g) {
    nb::list members;
    for (int r = 0; r < c.group_size(); ++r) members.append(c.has_rank(g, r) ? c.rank(g, r).ordinal : -1);
    groups.append(members);
  }
  d["groups"] = groups;
  return d;
}

nb::list errors(const Workspace& c) {
  nb::list out;
  for (int g = 0; g < c.group_count(); ++g) {
    for (int r = 0; r < c.group_size(); ++r) {
      if (!c.has_rank(g, r)) continue;
      const Rank& rk = c.rank(g, r);
      if (uint64_t w = c.error_word(rk)) {
        out.append(nb::make_tuple(g, r, rk.ordinal, w, c.describe_error(rk, w)));
      }
    }
  }
  return out;
}

std::vector<std::vector<std::string>> as_strings(const std::vector<std::vector<nb::bytes>>& handles) {
  std::vector<std::vector<std::string>> hs;
  for (const auto& g : handles) {
    hs.emplace_back();
    for (const auto& h : g) hs.back().emplace_back(h.c_str(), h.size());
  }
  return hs;
}

}  // namespace

void bind_workspaces(nb::module_& m) {
  m.def("create_workspace", [](const std::vector<std::vector<int>>& groups, bool virtual_ranks,
                               size_t scratch_bytes, uint64_t timeout_ms, int max_blocks, bool pdl,
                               bool signatures, bool trap, int carveout) {
    WorkspaceConfig cfg;
    cfg.scratch_bytes = scratch_bytes;
    cfg.timeout_ms = timeout_ms;
    cfg.pdl = pdl;
    cfg.signatures = signatures;
    cfg.trap = trap;
    cfg.carveout = carveout;
    nb::gil_scoped_release release;
    return workspace_create(groups, virtual_ranks, cfg, max_blocks);
  }, "groups"_a, "virtual_ranks"_a, "scratch_bytes"_a, "timeout_ms"_a, "max_blocks"_a = 0,
        "pdl"_a = true, "signatures"_a = true, "trap"_a = false, "carveout"_a = 0,
        "Builds a workspace over groups of CUDA ordinals (-1: a rank in another process, "
        "then max_blocks must be the bound every process agreed on) with the settings of "
        "WorkspaceConfig (ffi/runtime/config.h); returns its id.");
  m.def("workspace_ipc_handles", [](int64_t id) {
    std::vector<nb::bytes> out;
    const WorkspaceRef hold = workspace_or_throw(id);
    for (const std::string& h : hold->ipc_handles()) out.emplace_back(h.data(), h.size());
    return out;
  }, "id"_a, "CUDA IPC handles of the local ranks' memory, in (group, rank) order.");
  m.def("workspace_connect", [](int64_t id, const std::vector<std::vector<nb::bytes>>& handles) {
    const std::vector<std::vector<std::string>> hs = as_strings(handles);
    const WorkspaceRef hold = workspace_or_throw(id);
    Workspace& c = *hold;
    nb::gil_scoped_release release;
    c.connect(hs);
  }, "id"_a, "handles"_a, "Maps the other processes' memory (handles[g][r], b'' for local ranks).");
  m.def("workspace_info", [](int64_t id) { return info(*workspace_or_throw(id)); }, "id"_a);
  m.def("workspace_errors", [](int64_t id) { return errors(*workspace_or_throw(id)); }, "id"_a,
        "Errors recorded by the workspace's kernels: (group, rank, ordinal, word, message).");
  def_workspace_op(m, "workspace_reset", [](Workspace& c) { c.reset(); },
                   "Waits for the workspace's local devices to go idle, then puts its local ranks "
                   "back in the state of a new workspace (every rank of every group must be reset "
                   "before any runs a call again).");
  def_workspace_op(m, "workspace_quiesce", [](Workspace& c) { c.quiesce(); },
                   "Waits for the workspace's local devices to go idle.");
  def_workspace_op(m, "workspace_close_imports", [](Workspace& c) { c.close_imports(); },
                   "Unmaps the other processes' memory a workspace opened (devices idle first); "
                   "the workspace must run no call after this.");
  m.def("free_workspace", [](int64_t id, bool keep_exported) {
    nb::gil_scoped_release release;
    return workspace_free(id, keep_exported);
  }, "id"_a, "keep_exported"_a = false,
        "Frees a workspace once its devices are idle (keep_exported: memory whose IPC "
        "handles went to other processes stays allocated until this process ends).");
  m.def("free_all", [](bool keep_exported) {
    nb::gil_scoped_release release;
    workspace_free_all(keep_exported);
  }, "keep_exported"_a = false);
  m.def("workspace_ids", &workspace_ids);
  m.def("extension_api", [] {
    return nb::capsule(static_cast<const void*>(extension_api()), "jaxll.extension_api");
  }, "A capsule holding the const jaxll::ExtensionApi* (jaxll/extension.h).");
}

}  // namespace jaxll
