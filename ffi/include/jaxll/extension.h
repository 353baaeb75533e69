// The extension API: how a CUDA extension built outside jaxll runs collective
// kernels of its own on a jaxll workspace (host side; plain C++).
//
// In Python, jaxll.extension.api() returns a capsule named "jaxll.extension_api"
// that holds a `const ExtensionApi*`. An extension takes it once (an init
// function of its module), checks `version` and `rank_view_bytes` against the
// headers it was built with, registers its kernel loader (register_loader) and
// keeps the pointer. Its XLA FFI handler gets
// the workspace id as the `workspace` attribute (jaxll.extension.emit_call sets it)
// and the CUDA device ordinal XLA runs it on, asks get_rank_view for that rank,
// and passes the RankView by value to its kernel, which uses the device API
// (jaxll/jaxll.cuh).
//
// Calling contract of such a kernel (what jaxll's own kernels keep too):
//  - every rank of the group makes the same calls on the workspace, in the same
//    order, with the same grid (emit_call chains each call after the previous
//    jaxll call of its block, so XLA keeps that order);
//  - every block reserves its epochs with block_begin() and leaves at once,
//    without communicating, when that reports an earlier error;
//  - every wait is bounded (bounded_wait, ll16_wait) and a wait that gave up
//    records the error (spin_wait.cuh), so a lost peer never hangs the GPU;
//  - its kernels are loaded by a loader registered with register_loader before
//    their first call, so that they are loaded (and given jaxll's shared-memory
//    carveout) on a workspace's devices while it is built, never inside a step;
//  - a grid has at most `view.max_blocks` blocks. Those are co-resident with
//    every other rank's on the same GPU for kernels that hold at least as many
//    blocks per SM as jaxll's own (view.max_blocks is the SMs times the fewest
//    blocks per SM of jaxll's kernels at 512 threads, 2 on sm_90, divided by
//    the ranks per device): blocks of at most 512 threads within
//    __launch_bounds__(512, 2) (at most 64 registers a thread). A heavier
//    kernel must scale its grid down by its own occupancy
//    (cudaOccupancyMaxActiveBlocksPerMultiprocessor), or its ranks can wait
//    on blocks that never start until the waits give up.
#pragma once

#include <cstddef>
#include <cstdint>

#include "jaxll/rank_view.h"

namespace jaxll {

// 2: WorkspaceHeader gained the row-norm exchange; 3: get_rank_view_of;
// 4: the FFI attribute that carries the workspace id is `workspace` (was
// `comm`), register_loader; 5: kExtensionHasError fills the view too; 6: the
// WorkspaceHeader's row-norm partials are exact sums (kNormPartialWords packets);
// 7: they are one float each, a node of the row's tree of squares
constexpr uint32_t kExtensionApiVersion = 7;

// What get_rank_view returns.
enum ExtensionStatus : int {
  kExtensionOk = 0,
  kExtensionNoWorkspace = 1,  // no such workspace (freed by jaxll.free_workspaces()?)
  kExtensionNotMember = 2,    // the device is not a rank of it (or it is not connected)
  kExtensionHasError = 3,     // a kernel recorded an error there: fail the call (the
                              // message says which; the view is filled too, for a test
                              // that watches the kernels poison); jaxll.reset() clears it
  kExtensionBadArgument = 4,  // register_loader: a null loader
  kExtensionCudaError = 5,    // register_loader: the loader failed (the message is its)
};

struct ExtensionApi {
  uint32_t version;          // kExtensionApiVersion of the jaxll that filled it
  uint32_t rank_view_bytes;  // sizeof(RankView) in that jaxll
  // Fills *view with the rank of workspace `workspace` on CUDA device `ordinal`.
  // On anything but kExtensionOk writes a message into `error` (at most
  // `error_len` bytes including the terminating NUL). Safe to call from XLA's
  // execution threads (the workspace registry's lookups take no lock). The
  // view's memory stays allocated until jaxll.free_workspaces(), which lets
  // jaxll's own calls that are being launched finish their launch first but
  // cannot see an extension's: free a workspace only when no extension call
  // that got its view is still to launch.
  int (*get_rank_view)(int64_t workspace, int ordinal, RankView* view, char* error,
                       size_t error_len);
  // Fills *view with rank `rank` of group `group` of workspace `workspace`,
  // whatever device it is on: the way to the ranks of a virtual workspace
  // (jaxll.tools.testing.virtual_workspace: several ranks on one device, where the
  // ordinal does not tell them apart) for a host-driven test of an extension's
  // kernel. A virtual rank's kernel runs on a stream of its own, the ranks'
  // calls issued breadth-first (every rank's call, then anything that waits on
  // them), and a grid stays within view.max_blocks so that every rank's blocks
  // are resident at once. kExtensionNotMember for a rank of another process or
  // indices out of range. Same error contract as get_rank_view.
  int (*get_rank_view_of)(int64_t workspace, int group, int rank, RankView* view, char* error,
                          size_t error_len);
  // Registers the extension's kernel loader. `load(ordinal, carveout, error,
  // error_len)` must, in the extension's own CUDA runtime (a library linked with
  // the static runtime has its own, and only it knows the library's kernels),
  // make CUDA device `ordinal` current, load each of the extension's kernels
  // there (cudaFuncGetAttributes loads one), set `carveout` as their
  // cudaFuncAttributePreferredSharedMemoryCarveout when it is >= 0 (what jaxll
  // sets on its own kernels), restore the current device and return 0; or write
  // a message into `error` and return nonzero. jaxll runs it now on the devices
  // of the workspaces already built, and on every device of every workspace it
  // builds from then on, while it builds it: CUDA loads modules lazily, and a
  // first launch inside a step would load one under a global lock while peers
  // spin; where ranks share a GPU, a kernel that wants another shared-memory
  // configuration than the spinning blocks may never be placed. Call it from
  // the thread that initialises the extension, before its first call and while
  // no step runs (at import), never from an FFI handler. Registering a loader
  // twice is harmless. A loader that fails now is not kept
  // (kExtensionCudaError, with its message); one that fails later makes that
  // workspace's build fail with its message. kExtensionBadArgument: a null loader.
  int (*register_loader)(int (*load)(int ordinal, int carveout, char* error, size_t error_len),
                         char* error, size_t error_len);
};

}  // namespace jaxll
