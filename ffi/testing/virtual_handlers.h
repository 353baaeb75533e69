// The XLA FFI handler symbols of jaxll.testing's virtual-rank calls (defined in
// virtual_handlers.cc; the bindings register them).
#pragma once

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* jaxll_virtual_all_reduce_handler(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* jaxll_virtual_all_reduce_graph_handler(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* jaxll_virtual_all_reduce_rmsnorm_handler(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* jaxll_virtual_all_reduce_rmsnorm_graph_handler(XLA_FFI_CallFrame* call_frame);
}
