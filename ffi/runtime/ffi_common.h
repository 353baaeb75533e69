// Helpers of the XLA FFI handlers, shared by the runtime's (ffi_handlers.cc)
// and the virtual-rank testing ones (ffi/testing/virtual_handlers.cc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "../kernels/all_reduce.h"
#include "workspace.h"
#include "xla/ffi/api/ffi.h"

namespace jaxll {
namespace handlers {

// The kernel element type of an XLA element type (InvalidArgument for others).
xla::ffi::Error to_dtype(xla::ffi::DataType t, DType* out);
// InvalidArgument for an unknown algorithm or reduction code.
xla::ffi::Error check_call(int64_t algorithm, int64_t op);
// Makes CUDA device `ordinal` current (if it is not).
xla::ffi::Error use_device(int ordinal);
// A launcher's error (see ffi_handlers.cc): "no kernel" only where
// `kernel_exists` is false, else the launch that failed.
xla::ffi::Error launch_error(cudaError_t e, const Workspace& c, const std::string& what,
                             bool kernel_exists);
// Whether the fused call's operands agree (one element type; x's element count;
// weight of `hidden` elements).
bool rmsnorm_operands_match(const xla::ffi::AnyBuffer& x, const xla::ffi::AnyBuffer& residual,
                            const xla::ffi::AnyBuffer& weight, const xla::ffi::AnyBuffer& normed,
                            const xla::ffi::AnyBuffer& new_residual, int64_t hidden);
// The fused kernel's exchange from the FFI attribute "protocol".
xla::ffi::Error to_rmsnorm_protocol(int32_t code, RmsNormProtocol* out);
// A fused launch's error (a protocol asked for that cannot serve: InvalidArgument).
xla::ffi::Error rmsnorm_launch_error(cudaError_t e, Workspace& c, const std::string& what,
                                     RmsNormProtocol protocol);

}  // namespace handlers
}  // namespace jaxll
