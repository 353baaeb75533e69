// An FFI handler's way to its rank: the workspace the call names, held for the
// handler's duration, and the rank on the call's device.
#pragma once

#include <cstdint>

#include "runtime/registry.h"
#include "xla/ffi/api/ffi.h"

namespace jaxll {

// The rank of workspace `workspace_id` (held by `hold`, which the caller keeps
// until its launch is enqueued) on CUDA device `ordinal`, ready for a call: it
// exists, the device is a member, and no kernel recorded an error there.
xla::ffi::Error find_rank(const WorkspaceRef& hold, int64_t workspace_id, int32_t ordinal,
                          Workspace** ws, Rank** rank);

// The rank's view for one call: programmatic dependent launch only where the
// call's attribute `uses_pdl` allows it as well as the workspace.
inline RankView call_view(const Rank& rank, bool uses_pdl) {
  RankView v = rank.view;
  if (!uses_pdl) v.pdl = 0;
  return v;
}

}  // namespace jaxll
