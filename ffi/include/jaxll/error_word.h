// The 64-bit error word a kernel writes when it gives up, and its decoding.
//
//   bit 63      set: the word holds an error
//   bits 56-59  kind (ErrorKind)
//   bits 48-55  rank that gave up
//   bits 40-47  peer it was waiting for
//   bits 32-39  block index
//   bits  0-31  epoch of that block at the time
#pragma once

#include <cstdint>

#include "jaxll/workspace_layout.h"

namespace jaxll {

enum class ErrorKind : uint32_t {
  kNone = 0,
  kTimeout = 1,  // a bounded spin-wait ran past its deadline
};

JAXLL_HOST_DEVICE inline uint64_t encode_error(ErrorKind kind, uint32_t rank, uint32_t peer,
                                               uint32_t block, uint32_t epoch) {
  return (1ull << 63) | (static_cast<uint64_t>(kind) & 0xF) << 56 |
         (static_cast<uint64_t>(rank) & 0xFF) << 48 | (static_cast<uint64_t>(peer) & 0xFF) << 40 |
         (static_cast<uint64_t>(block) & 0xFF) << 32 | epoch;
}

struct DecodedError {
  ErrorKind kind;
  uint32_t rank, peer, block, epoch;
};

JAXLL_HOST_DEVICE inline DecodedError decode_error(uint64_t word) {
  return DecodedError{static_cast<ErrorKind>((word >> 56) & 0xF),
                      static_cast<uint32_t>((word >> 48) & 0xFF),
                      static_cast<uint32_t>((word >> 40) & 0xFF),
                      static_cast<uint32_t>((word >> 32) & 0xFF),
                      static_cast<uint32_t>(word & 0xFFFFFFFFu)};
}

}  // namespace jaxll
