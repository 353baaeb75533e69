// The outcome of a host-side step of a collective (planning a call, launching
// it): jaxll's own codes, and the CUDA error where CUDA refused something.
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace jaxll {

enum class StatusCode {
  kOk,
  kNoKernel,  // no kernel for this combination of algorithm, element type and operator
  kRefused,   // the exchange the caller named cannot serve this call (its plan has no cut)
  kNoPlan,    // no launch plan: an empty message or geometry, or ranks of one launch
              // whose plans differ
  kCuda,      // CUDA refused the launch (cuda() says why)
};

class Status {
 public:
  static Status Ok() { return Status(StatusCode::kOk); }
  static Status NoKernel() { return Status(StatusCode::kNoKernel); }
  static Status Refused() { return Status(StatusCode::kRefused); }
  static Status NoPlan() { return Status(StatusCode::kNoPlan); }
  // Ok() for cudaSuccess.
  static Status Cuda(cudaError_t e) {
    return e == cudaSuccess ? Ok() : Status(StatusCode::kCuda, e);
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  cudaError_t cuda() const { return cuda_; }
  // "no kernel for ...", "CUDA error cudaErrorInvalidValue (invalid argument)", ...
  std::string describe() const {
    switch (code_) {
      case StatusCode::kOk: return "ok";
      case StatusCode::kNoKernel:
        return "no kernel (algorithm, element type and reduction do not go together)";
      case StatusCode::kRefused: return "the exchange asked for cannot serve this call";
      case StatusCode::kNoPlan: return "no launch plan (ranks of one launch must plan alike)";
      case StatusCode::kCuda:
        return std::string("CUDA error ") + cudaGetErrorName(cuda_) + " (" +
               cudaGetErrorString(cuda_) + ")";
    }
    return "unknown status";
  }

 private:
  explicit Status(StatusCode code, cudaError_t cuda = cudaSuccess) : code_(code), cuda_(cuda) {}
  StatusCode code_;
  cudaError_t cuda_;
};

}  // namespace jaxll
