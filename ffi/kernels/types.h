// What a collective call is made of: element types, reduction operators,
// algorithms and collectives, with the one table of their codes (Python reads
// it through the module: _jaxll.codes()), and the call signature every rank of
// a group must agree on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace jaxll {

// Element types with a kernel.
enum class DType : int { kF32 = 0, kBF16 = 1, kF16 = 2, kI32 = 3 };
// Reduction operators.
enum class ReduceOp : int { kSum = 0, kMax = 1, kMin = 2 };
// Kernel algorithms (0, "xla", is XLA's own collective and has no kernel).
enum class Algorithm : int {
  kOneShotLL = 1,
  kOneShotSentinel = 2,
  kTwoShotLL = 3,
  kTwoShotSentinel = 4,
  kTwoShotLL128Atomic = 5,
  kOneShotBarrier = 6,
  kTwoShotBarrier = 7,
};
constexpr int kLastAlgorithm = 7;
// The collective field of a call signature.
enum class Collective : uint32_t {
  kAllReduce = 0,
  kRmsNorm = 1,
  kAllGather = 2,
  kReduceScatter = 3,
  kPermute = 4,
  kAllToAll = 5,
  kRaggedAllToAll = 6,
};

int dtype_bytes(DType t);

struct CodeName {
  const char* name;
  int code;
};
const std::vector<CodeName>& algorithm_codes();
const std::vector<CodeName>& dtype_codes();
const std::vector<CodeName>& op_codes();
const std::vector<CodeName>& collective_codes();

// The signature of an all-reduce (jaxll/error_word.h).
uint64_t call_signature(Algorithm algorithm, DType dtype, ReduceOp op, int64_t count);
// "all_reduce of 1024 float32 elements, op sum, algorithm oneshot_ll".
std::string describe_signature(uint64_t signature);

// The fused call's signature keeps the shape in its count field: tokens in bits
// 20-39 and hidden in bits 0-19 (each modulo 2^20), so ranks that call with
// different shapes of one size are told apart.
constexpr uint64_t rmsnorm_signature_shape(int64_t tokens, int64_t hidden) {
  return (static_cast<uint64_t>(tokens) & 0xFFFFF) << 20 | (static_cast<uint64_t>(hidden) & 0xFFFFF);
}

}  // namespace jaxll
