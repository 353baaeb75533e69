// The argument block of jaxll's collective kernels (host and device).
#pragma once

#include <cstdint>

#include "jaxll/rank_view.h"

namespace jaxll {

struct AllReduceArgs {
  RankView view;
  const void* in;
  void* out;
  int64_t count;         // elements per rank
  int64_t units;         // transfer units in the message
  int64_t span;          // units per block (the last block may have fewer, never zero)
  int64_t round_units;   // most units one block moves in one round
  uint32_t rounds;       // rounds of every block but the last (computed on the host)
  uint32_t last_rounds;  // rounds of the last block
  int trigger;           // let the stream's next kernel launch early (launch_order.cuh)
  uint64_t signature;    // the call's signature (error_word.h), checked against every peer's
};

// The most bytes of parameters a kernel may take (CUDA 12.1 and newer, with a
// driver of release 530 or newer; before that 4 KB).
constexpr size_t kMaxKernelParamBytes = 32764;

}  // namespace jaxll
