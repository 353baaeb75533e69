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
  kTimeout = 1,   // a bounded spin-wait ran past its deadline
  kMismatch = 2,  // a peer's call had another signature (count, dtype, op, algorithm)
  kFreed = 3,     // the workspace was freed (set by the host; see workspace.cc)
  kNotStarted = 4,  // a timeout waiting for a peer's call signature: the peer never
                    // started the call
  kRagged = 5,  // a ragged all-to-all's slice out of range, or sizes that ranks disagree
                // on (the host record says which: kernels/ragged.h)
};

// A call's signature: what every rank of a group must agree on, one 64-bit word
// (never zero).
//   bits  0-39  element count per rank (modulo 2^40)
//   bits 40-43  algorithm code      bits 44-47  dtype code
//   bits 48-51  reduction code      bits 56-59  collective (0: all-reduce)
//   bit  63     set
JAXLL_HOST_DEVICE inline uint64_t encode_signature(uint32_t collective, uint32_t algorithm,
                                                   uint32_t dtype, uint32_t op, int64_t count) {
  return (1ull << 63) | (static_cast<uint64_t>(collective) & 0xF) << 56 |
         (static_cast<uint64_t>(op) & 0xF) << 48 | (static_cast<uint64_t>(dtype) & 0xF) << 44 |
         (static_cast<uint64_t>(algorithm) & 0xF) << 40 |
         (static_cast<uint64_t>(count) & ((1ull << 40) - 1));
}

struct DecodedSignature {
  uint32_t collective, algorithm, dtype, op;
  uint64_t count;
};

JAXLL_HOST_DEVICE inline DecodedSignature decode_signature(uint64_t sig) {
  return DecodedSignature{static_cast<uint32_t>((sig >> 56) & 0xF),
                          static_cast<uint32_t>((sig >> 40) & 0xF),
                          static_cast<uint32_t>((sig >> 44) & 0xF),
                          static_cast<uint32_t>((sig >> 48) & 0xF), sig & ((1ull << 40) - 1)};
}

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
