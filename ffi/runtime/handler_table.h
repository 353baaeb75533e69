// A Python module's table of XLA FFI handlers (header-only: the runtime's
// module and the tools' module each keep one).
#pragma once

#include <nanobind/nanobind.h>

#include <string>
#include <vector>

#include "xla/ffi/api/c_api.h"

namespace jaxll {

// XLA FFI handlers by target name, whether XLA may capture each into a
// command buffer, and its record stage where it has one (runtime/record_stage.h;
// jaxll/native.py registers them from this table).
class HandlerTable {
 public:
  void add(const char* name, XLA_FFI_Handler* handler, bool command_buffer,
           XLA_FFI_Handler* record = nullptr) {
    entries_.push_back({name, handler, command_buffer, record});
  }
  // {name: (capsule, command_buffer, record capsule or None)}.
  nanobind::dict as_dict() const {
    nanobind::dict d;
    for (const Entry& e : entries_) {
      nanobind::object record = nanobind::none();
      if (e.record) record = nanobind::capsule(reinterpret_cast<void*>(e.record));
      d[e.name.c_str()] = nanobind::make_tuple(
          nanobind::capsule(reinterpret_cast<void*>(e.handler)), e.command_buffer, record);
    }
    return d;
  }

 private:
  struct Entry {
    std::string name;
    XLA_FFI_Handler* handler;
    bool command_buffer;
    XLA_FFI_Handler* record;
  };
  std::vector<Entry> entries_;
};

}  // namespace jaxll
