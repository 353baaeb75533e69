// What each part of the testing module adds to jaxll._jaxll_testing.
#pragma once

#include <nanobind/nanobind.h>

#include "runtime/handler_table.h"

namespace jaxll {

void bind_drivers(nanobind::module_& m);           // driver_bindings.cc
void add_virtual_handlers(HandlerTable& handlers);  // virtual_ffi.cc

}  // namespace jaxll
