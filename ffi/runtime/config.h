// How a workspace is built and how its kernels behave. Every value comes from
// jaxll's Python settings (jaxll/settings.py reads and checks every JAXLL_*
// variable); nothing here reads the environment.
#pragma once

#include <cstddef>
#include <cstdint>

namespace jaxll {

struct WorkspaceConfig {
  size_t scratch_bytes = 0;  // payload bytes per rank one one-shot round moves (all blocks)
  uint64_t timeout_ms = 0;   // deadline of every spin-wait
  // Kernels may launch with programmatic dependent launch (where the device
  // has it: compute capability 9.0 and newer).
  bool pdl = true;
  // Every call's signature is checked against the peers' (jaxll/round.cuh).
  bool signatures = true;
  // A kernel that gives up traps after recording the error (else it poisons
  // its output and later calls do too).
  bool trap = false;
  // The shared-memory carveout every kernel gets when a workspace loads it
  // (percent of the most shared memory; -1 leaves the driver's choice).
  int carveout = 0;
};

}  // namespace jaxll
