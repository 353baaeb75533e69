// What each part of the runtime adds to a runtime layer's Python module (module.cc): its
// bindings, and its XLA FFI handlers in the module's handler table. module.cc
// calls every bind_* function; each lives beside the code it binds.
#pragma once

#include <nanobind/nanobind.h>

#include "runtime/handler_table.h"

namespace jaxll {

void bind_all_reduce(nanobind::module_& m, HandlerTable& handlers);       // all_reduce_op.cc
void bind_all_reduce_rmsnorm(nanobind::module_& m, HandlerTable& handlers);  // rmsnorm_op.cc
void bind_gather_scatter(nanobind::module_& m, HandlerTable& handlers);   // gather_scatter_op.cc
void bind_exchange(nanobind::module_& m, HandlerTable& handlers);         // exchange_op.cc
void bind_ragged_all_to_all(nanobind::module_& m, HandlerTable& handlers);  // ragged_op.cc
void bind_program_ops(nanobind::module_& m, HandlerTable& handlers);      // program_ops.cc
void bind_workspaces(nanobind::module_& m);                               // workspace_bindings.cc
void bind_devices(nanobind::module_& m);                                  // device_bindings.cc
void bind_codes(nanobind::module_& m);                                    // code_bindings.cc

}  // namespace jaxll
