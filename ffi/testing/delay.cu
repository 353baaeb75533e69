#include "testing/delay.h"

#include "jaxll/spin_wait.cuh"

namespace jaxll {
namespace {

__global__ void delay_kernel(uint64_t ns) {
  const uint64_t start = globaltimer_ns();
  while (globaltimer_ns() - start < ns) {
  }
}

}  // namespace

void launch_delay(cudaStream_t stream, uint64_t ns) { delay_kernel<<<1, 1, 0, stream>>>(ns); }

const void* delay_kernel_function() { return reinterpret_cast<const void*>(&delay_kernel); }

}  // namespace jaxll
