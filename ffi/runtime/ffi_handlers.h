// The XLA FFI handler symbols jaxll registers (defined in ffi_handlers.cc).
#pragma once

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* jaxll_all_reduce_handler(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* jaxll_device_ordinal_handler(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* jaxll_noop_handler(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* jaxll_check_handler(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* jaxll_all_reduce_rmsnorm_handler(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* jaxll_gather_scatter_handler(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* jaxll_join_handler(XLA_FFI_CallFrame* call_frame);
}
