// What every XLA FFI handler of jaxll's (and of its tools) needs: element types,
// the device, and jaxll's statuses as FFI errors. Header-only, so that a tool's
// module shares it without linking the runtime.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/rmsnorm.h"
#include "kernels/status.h"
#include "kernels/types.h"
#include "xla/ffi/api/ffi.h"

namespace jaxll {

// The kernel element type of an XLA element type (InvalidArgument for others).
inline xla::ffi::Error to_dtype(xla::ffi::DataType t, DType* out) {
  switch (t) {
    case xla::ffi::DataType::F32: *out = DType::kF32; return xla::ffi::Error::Success();
    case xla::ffi::DataType::BF16: *out = DType::kBF16; return xla::ffi::Error::Success();
    case xla::ffi::DataType::F16: *out = DType::kF16; return xla::ffi::Error::Success();
    case xla::ffi::DataType::S32: *out = DType::kI32; return xla::ffi::Error::Success();
    default:
      return xla::ffi::Error::InvalidArgument(
          "jaxll: no kernel for this element type (supported: float32, bfloat16, float16, int32)");
  }
}

// Makes CUDA device `ordinal` current (if it is not).
inline xla::ffi::Error use_device(int ordinal) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != ordinal) {
    if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) {
      return xla::ffi::Error::Internal(std::string("jaxll: cudaSetDevice failed: ") +
                                       cudaGetErrorString(e));
    }
  }
  return xla::ffi::Error::Success();
}

// A launch's status as the call's error: `what` names the call ("an all-reduce
// of 1024 elements"), `workspace` its workspace. A kernel that does not exist
// for the call's types, or an exchange that cannot serve it, is the caller's
// (InvalidArgument); the rest is the launch's (Internal).
inline xla::ffi::Error status_error(const Status& s, const std::string& what, int64_t workspace) {
  const std::string where = what + " on workspace " + std::to_string(workspace);
  switch (s.code()) {
    case StatusCode::kOk: return xla::ffi::Error::Success();
    case StatusCode::kNoKernel:
      return xla::ffi::Error::InvalidArgument("jaxll: no kernel for " + where +
                                              " (algorithm, element type and reduction do not "
                                              "go together)");
    case StatusCode::kRefused:
      return xla::ffi::Error::InvalidArgument("jaxll: " + where + ": the exchange asked for "
                                              "cannot serve this call");
    default:
      return xla::ffi::Error::Internal("jaxll: launching " + where + " failed: " + s.describe());
  }
}

// The fused call's exchange from the FFI attribute "protocol".
inline xla::ffi::Error to_rmsnorm_protocol(int32_t code, RmsNormProtocol* out) {
  if (rmsnorm_protocol_name(code) == nullptr) {
    return xla::ffi::Error::InvalidArgument("jaxll: all_reduce_rmsnorm: unknown protocol code " +
                                            std::to_string(code));
  }
  *out = static_cast<RmsNormProtocol>(code);
  return xla::ffi::Error::Success();
}

// A fused launch's status as the call's error: a refusal names the protocol's
// condition (rmsnorm_refusal).
inline xla::ffi::Error rmsnorm_status_error(const Status& s, const std::string& what,
                                            int64_t workspace, RmsNormProtocol protocol) {
  if (s.code() == StatusCode::kRefused) {
    return xla::ffi::Error::InvalidArgument("jaxll: " + what + ": the protocol asked for cannot "
                                            "serve this call: " + rmsnorm_refusal(protocol));
  }
  return status_error(s, what, workspace);
}

// Whether the fused call's operands agree: one element type; residual, normed
// and new_residual of x's element count; weight of `hidden` elements.
inline bool rmsnorm_operands_match(const xla::ffi::AnyBuffer& x, const xla::ffi::AnyBuffer& residual,
                                   const xla::ffi::AnyBuffer& weight,
                                   const xla::ffi::AnyBuffer& normed,
                                   const xla::ffi::AnyBuffer& new_residual, int64_t hidden) {
  const size_t count = x.element_count();
  for (const xla::ffi::AnyBuffer* b : {&residual, &weight, &normed, &new_residual}) {
    if (b->element_type() != x.element_type()) return false;
  }
  return residual.element_count() == count && normed.element_count() == count &&
         new_residual.element_count() == count &&
         static_cast<int64_t>(weight.element_count()) == hidden;
}

}  // namespace jaxll
