// Ragged all-to-all on the LL16 protocol (ragged.cu): jax.lax.ragged_all_to_all's
// semantics. Rank r's offset and size arrays hold nranks x `slices` entries;
// entry i = d x slices + k describes slice k that rank r sends to rank d:
// rows [input_offsets[i], + send_sizes[i]) of its operand land at rows
// [output_offsets[i], + send_sizes[i]) of rank d's output, and rank d expects
// recv_sizes[r x slices + k] of them. A row is `row_elems` elements. Rows of
// the output that no slice writes keep their value (the result is the output
// buffer, updated in place: XLA aliases them).
//
// Sizes and offsets travel with the data: each round a sender puts a header of
// (size, output offset) per slice in front of its units, so a receiver learns
// what comes from the same packets it waits on, with no round trip before the
// data. A slice out of its operand's or output's rows, or a size the receiver
// did not expect, is recorded as an error (ErrorKind::kRagged) and poisons the
// output, as a timeout does.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "jaxll/rank_view.h"
#include "kernels/status.h"
#include "kernels/types.h"

namespace jaxll {

// Most slices a rank sends to one peer (the arrays hold nranks x this at most).
constexpr int kMaxRaggedSlices = 32;

struct RaggedCall {
  const void* operand;
  void* output;  // the result, which is the `output` operand (aliased)
  int64_t operand_rows, output_rows, row_elems;
  // nranks x slices entries each, int32, in device memory
  const int32_t* input_offsets;
  const int32_t* send_sizes;
  const int32_t* output_offsets;
  const int32_t* recv_sizes;
  int slices;  // per peer
};

bool has_ragged_kernel(Algorithm algorithm, DType dtype);
// NoKernel: no kernel for the combination; NoPlan: too many slices, or nothing
// fits the scratch.
Status launch_ragged_all_to_all(Algorithm algorithm, DType dtype, const RankView& view,
                                const RaggedCall& call, cudaStream_t stream);
std::vector<const void*> ragged_kernel_functions();

// What a kRagged error's host record holds (error_word.h): word 1 is
// problem << 48 | slice << 32 | a, word 2 is b << 32 | c.
enum class RaggedProblem : uint32_t {
  kSizes = 1,        // receiver expected a rows (recv_sizes), the sender sends b
  kInputRange = 2,   // sender's slice: rows [a, a + b) of an operand of c rows
  kOutputRange = 3,  // the slice's rows [a, a + b) of an output of c rows
  kPeerSlice = 4,    // the sender's slice was out of range (it records why)
};
JAXLL_HOST_DEVICE constexpr uint64_t ragged_record(RaggedProblem p, uint32_t slice, uint32_t a) {
  return static_cast<uint64_t>(p) << 48 | static_cast<uint64_t>(slice & 0xFFFF) << 32 | a;
}
JAXLL_HOST_DEVICE constexpr uint64_t ragged_values(uint32_t b, uint32_t c) {
  return static_cast<uint64_t>(b) << 32 | c;
}

}  // namespace jaxll
