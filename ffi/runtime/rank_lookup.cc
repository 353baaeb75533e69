#include "runtime/rank_lookup.h"

#include <string>

namespace jaxll {

xla::ffi::Error find_rank(const WorkspaceRef& hold, int64_t workspace_id, int32_t ordinal,
                          Workspace** ws, Rank** rank) {
  namespace ffi = xla::ffi;
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

}  // namespace jaxll
