// A kernel's view of its rank of a symmetric workspace (plain data, host and device).
//
// A RankView is small and passed by value as a kernel parameter, so reaching a
// peer costs no memory load: `peers.base[p]` is rank p's workspace as mapped on
// this rank's device (peer access, or for virtual ranks the same GPU).
#pragma once

#include <cstdint>

#include "jaxll/workspace_layout.h"

namespace jaxll {

struct PeerTable {
  char* base[kMaxRanks];
};

struct RankView {
  WorkspaceHeader* header;         // this rank's header (an allocation of its own)
  unsigned long long* host_error;  // mapped host record (kHostErrorWords; word 0 mirrors
                                   // header->error)
  PeerTable peers;
  ScratchGeometry geo;             // where the scratch areas are (same on every rank)
  int rank;
  int nranks;
  int max_blocks;                  // largest grid whose blocks are all co-resident
  int pdl;                         // launch with programmatic dependent launch (see
                                   // launch_order.cuh); set by the host, not read on the device
  uint64_t timeout_ns;
  int trap;                        // JAXLL_ON_ERROR=trap: trap after recording an error
  int signatures;                  // check call signatures (JAXLL_SIGNATURES, default 1)
};

}  // namespace jaxll
