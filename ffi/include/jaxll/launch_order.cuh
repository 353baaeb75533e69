// Programmatic dependent launch (PDL) from inside a collective kernel.
//
// A kernel launched with the programmatic-stream-serialization attribute may be
// scheduled while the kernel ahead of it on its stream is still running, so its
// launch and prologue overlap that kernel's tail. It must call
// grid_dependency_wait() before it touches anything the earlier kernel may
// write: its input buffer, the workspace header (epochs, error word) and
// scratch. The wait returns once every earlier kernel of the stream has
// completed and its memory is visible; without the attribute it returns at once.
//
// allow_dependent_launch() lets the next kernel of the stream be scheduled now
// (otherwise that happens as this kernel's blocks exit). Call it only after
// grid_dependency_wait(), so that at most two kernels of one stream are ever
// resident, and only when this grid and the next one fit on the device together
// with every other rank's (the host decides; see launch_all_reduce).
#pragma once

namespace jaxll {

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace jaxll
