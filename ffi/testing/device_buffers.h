// Device buffers of a test, freed on scope exit.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "kernels/cuda_call.h"

namespace jaxll {

class DeviceBuffers {
 public:
  void* alloc(size_t bytes) {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), "allocating test buffers");
    ptrs_.push_back(p);
    return p;
  }
  ~DeviceBuffers() {
    for (void* p : ptrs_) cudaFree(p);
  }

 private:
  std::vector<void*> ptrs_;
};

}  // namespace jaxll
