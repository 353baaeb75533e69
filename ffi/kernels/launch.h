// The one launch path of jaxll's kernels, and the two rules it follows: when a
// grid may launch early (programmatic dependent launch) and how many thread-block
// clusters a rank may keep resident.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "jaxll/rank_view.h"
#include "kernels/status.h"

namespace jaxll {

// Whether a grid of `blocks` blocks on `view`'s workspace launches with
// programmatic dependent launch: only where the workspace allows it and two of
// the rank's grids fit within its co-residency bound (the grid may then be
// resident beside the one ahead of it on the stream).
bool launches_early(const RankView& view, int64_t blocks);

// Launches collective kernel `fn` with its one argument struct `args` of
// `args_bytes` bytes, as a programmatic dependent launch when `pdl`, in
// thread-block clusters of `cluster` consecutive blocks when `cluster` > 1 (it
// must divide `blocks`); a grid of `blocks` x `ranks` (ranks > 1: every rank of
// a virtual group in one launch, ffi/testing). Inside a LaunchCapture's scope
// the launch is described to it instead.
Status launch_collective(const void* fn, int64_t blocks, int threads, bool pdl, const void* args,
                         size_t args_bytes, cudaStream_t stream, int cluster = 1, int ranks = 1);

template <class Args>
Status launch_collective(const void* fn, int64_t blocks, int threads, bool pdl, const Args* args,
                         cudaStream_t stream, int cluster = 1, int ranks = 1) {
  return launch_collective(fn, blocks, threads, pdl, args, sizeof(Args), stream, cluster, ranks);
}

// One launch as launch_collective would make it.
struct CapturedLaunch {
  static constexpr size_t kMaxArgsBytes = 4096;  // (CUDA's classic parameter limit)
  const void* fn = nullptr;
  int64_t blocks = 0;
  int threads = 0, cluster = 1;
  bool pdl = false;
  size_t args_bytes = 0;
  alignas(16) unsigned char args[kMaxArgsBytes];
};

// While one lives, launch_collective on this thread launches nothing: it
// describes the call's one launch here (XLA's record stage then adds it to a
// command buffer as a kernel node: runtime/record_stage.h). A second launch, a
// virtual group's launch or arguments over kMaxArgsBytes are refused (NoPlan).
class LaunchCapture {
 public:
  LaunchCapture();
  ~LaunchCapture();
  LaunchCapture(const LaunchCapture&) = delete;
  LaunchCapture& operator=(const LaunchCapture&) = delete;
  // The launch described (nullptr: none was made).
  const CapturedLaunch* launch() const { return count_ ? &launch_ : nullptr; }
  // Whether a launch was refused.
  bool refused() const { return refused_; }

 private:
  friend Status launch_collective(const void*, int64_t, int, bool, const void*, size_t,
                                  cudaStream_t, int, int);
  CapturedLaunch launch_;
  int count_ = 0;
  bool refused_ = false;
  LaunchCapture* outer_;
};

// The driver's handle of kernel `fn` of this library (nullptr where CUDA gives
// none). Only the library's own CUDA runtime knows its kernels (kernels.h), so
// a module that hands a kernel to XLA asks here.
cudaFunction_t kernel_handle(const void* fn);

// How many clusters of `cluster` blocks of `threads` threads of kernel `fn` a
// rank on `view`'s workspace may keep resident at once: the device's capacity
// for such clusters (cudaOccupancyMaxActiveClusters on the current device)
// times the rank's share of the co-residency bound (view.max_blocks over the
// SM count times fn's blocks per SM at kBlockThreads), so that every rank
// sharing the GPU fits its clusters beside the others'. 0 where the device
// cannot launch clusters. Cached per device, kernel and shape.
int64_t cluster_allowance(const void* fn, int cluster, int threads, const RankView& view);

}  // namespace jaxll
