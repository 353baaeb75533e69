// The extension API (jaxll/extension.h) over the workspace registry.
#include "runtime/extension_api.h"

#include <cstdio>
#include <exception>
#include <string>

#include "runtime/registry.h"

namespace jaxll {
namespace {

int fail(int status, const std::string& message, char* error, size_t error_len) {
  if (error != nullptr && error_len > 0) std::snprintf(error, error_len, "%s", message.c_str());
  return status;
}

int no_workspace(int64_t workspace, char* error, size_t error_len) {
  return fail(kExtensionNoWorkspace,
              "jaxll: workspace " + std::to_string(workspace) +
                  " does not exist (freed by jaxll.free_workspaces()?)",
              error, error_len);
}

int get_rank_view(int64_t workspace, int ordinal, RankView* view, char* error, size_t error_len) {
  const WorkspaceRef hold(workspace);  // (the view is copied out before it ends)
  Workspace* c = hold.get();
  if (c == nullptr) return no_workspace(workspace, error, error_len);
  Rank* r = c->rank_for_ordinal(ordinal);
  if (r == nullptr || !c->connected()) {
    return fail(kExtensionNotMember,
                "jaxll: CUDA device " + std::to_string(ordinal) + " is not a member of workspace " +
                    std::to_string(workspace),
                error, error_len);
  }
  *view = r->view;
  if (uint64_t word = c->error_word(*r)) {
    return fail(kExtensionHasError, c->describe_error(*r, word), error, error_len);
  }
  return kExtensionOk;
}

int get_rank_view_of(int64_t workspace, int group, int rank, RankView* view, char* error,
                     size_t error_len) {
  const WorkspaceRef hold(workspace);  // (the view is copied out before it ends)
  Workspace* c = hold.get();
  if (c == nullptr) return no_workspace(workspace, error, error_len);
  const std::string which = "rank " + std::to_string(rank) + " of group " + std::to_string(group) +
                            " of workspace " + std::to_string(workspace);
  if (group < 0 || group >= c->group_count() || rank < 0 || rank >= c->group_size()) {
    return fail(kExtensionNotMember,
                "jaxll: no " + which + " (" + std::to_string(c->group_count()) + " groups of " +
                    std::to_string(c->group_size()) + " ranks)",
                error, error_len);
  }
  if (!c->has_rank(group, rank) || !c->connected()) {
    return fail(kExtensionNotMember, "jaxll: " + which + " is not in this process", error,
                error_len);
  }
  const Rank& r = c->rank(group, rank);
  *view = r.view;
  if (uint64_t word = c->error_word(r)) {
    return fail(kExtensionHasError, c->describe_error(r, word), error, error_len);
  }
  return kExtensionOk;
}

int register_loader(int (*load)(int ordinal, int carveout, char* error, size_t error_len),
                    char* error, size_t error_len) {
  if (load == nullptr) {
    return fail(kExtensionBadArgument, "jaxll: register_loader takes a loader function", error,
                error_len);
  }
  try {
    register_kernel_loader(load);
  } catch (const std::exception& e) {
    return fail(kExtensionCudaError, std::string("jaxll: ") + e.what(), error, error_len);
  }
  return kExtensionOk;
}

}  // namespace

const ExtensionApi* extension_api() {
  static const ExtensionApi api{kExtensionApiVersion, static_cast<uint32_t>(sizeof(RankView)),
                                &get_rank_view, &get_rank_view_of, &register_loader};
  return &api;
}

}  // namespace jaxll
