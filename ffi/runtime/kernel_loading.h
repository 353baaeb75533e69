// Loading every kernel a workspace may launch on its devices while it is built,
// and the grid bound their occupancy allows.
//
// With CUDA's lazy loading a kernel loaded on first launch, while a collective
// spins elsewhere, can stall behind it until the collective's deadline; and an
// SM changes its shared-memory configuration only when idle, so where ranks
// share a GPU a lagging rank's kernel that wants another configuration than the
// spinning blocks may never be placed. So every kernel is loaded up front, each
// with one carveout preference (WorkspaceConfig::carveout).
#pragma once

#include <cstddef>

namespace jaxll {

// An extension's (or a tool's) kernel loader: loads its kernels on CUDA device
// `ordinal` with `carveout`; nonzero and a message in `error` on failure
// (jaxll/extension.h, register_loader).
using KernelLoader = int (*)(int ordinal, int carveout, char* error, size_t error_len);

// Loads jaxll's kernels on CUDA device `ordinal`, then runs every kept loader
// there. Throws std::runtime_error on failure.
void load_kernels(int ordinal, int carveout);
// Runs `load` on CUDA device `ordinal`; throws std::runtime_error with its message.
void run_loader(KernelLoader load, int ordinal, int carveout);
// Keeps `load`: load_kernels runs it from now on (once, however often kept).
void keep_loader(KernelLoader load);

// SMs times the lowest occupancy of jaxll's kernels on CUDA device `ordinal`
// (loads them there first): the most blocks that can be co-resident.
int device_block_bound(int ordinal, int carveout);

}  // namespace jaxll
