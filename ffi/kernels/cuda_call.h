// Host helpers around the CUDA runtime shared by the runtime and the tools:
// checked calls and a scoped current device.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace jaxll {

// Throws std::runtime_error("<what>: <CUDA error>") if `err` is not cudaSuccess
// (after clearing a sticky launch error, so that later calls are not confused).
inline void check_cuda(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
}

// Makes `device` current (if >= 0) and restores the caller's device on scope exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device = -1) {
    has_prev_ = cudaGetDevice(&prev_) == cudaSuccess;
    if (device >= 0) check_cuda(cudaSetDevice(device), "selecting CUDA device " + std::to_string(device));
  }
  ~DeviceGuard() {
    if (has_prev_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool has_prev_ = false;
};

}  // namespace jaxll
