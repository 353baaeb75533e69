// A Python module's table of XLA FFI handlers (header-only: the runtime's
// module and the tools' module each keep one).
#pragma once

#include <nanobind/nanobind.h>

#include <string>
#include <vector>

#include "xla/ffi/api/c_api.h"

namespace jaxll {

// XLA FFI handlers by target name, and whether XLA may capture each into a
// command buffer (jaxll/native.py registers them from this table).
class HandlerTable {
 public:
  void add(const char* name, XLA_FFI_Handler* handler, bool command_buffer) {
    entries_.push_back({name, handler, command_buffer});
  }
  // {name: (capsule, command_buffer)}.
  nanobind::dict as_dict() const {
    nanobind::dict d;
    for (const Entry& e : entries_) {
      d[e.name.c_str()] = nanobind::make_tuple(
          nanobind::capsule(reinterpret_cast<void*>(e.handler)), e.command_buffer);
    }
    return d;
  }

 private:
  struct Entry {
    std::string name;
    XLA_FFI_Handler* handler;
    bool command_buffer;
  };
  std::vector<Entry> entries_;
};

}  // namespace jaxll
