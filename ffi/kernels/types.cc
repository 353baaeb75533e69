#include "kernels/types.h"

#include "jaxll/error_word.h"

namespace jaxll {

int dtype_bytes(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kI32: return 4;
  }
  return 0;
}

const std::vector<CodeName>& algorithm_codes() {
  static const std::vector<CodeName> t = {
      {"xla", 0},
      {"oneshot_ll", static_cast<int>(Algorithm::kOneShotLL)},
      {"oneshot_sentinel", static_cast<int>(Algorithm::kOneShotSentinel)},
      {"twoshot_ll", static_cast<int>(Algorithm::kTwoShotLL)},
      {"twoshot_sentinel", static_cast<int>(Algorithm::kTwoShotSentinel)},
      {"twoshot_ll128_atomic", static_cast<int>(Algorithm::kTwoShotLL128Atomic)},
      {"oneshot_barrier", static_cast<int>(Algorithm::kOneShotBarrier)},
      {"twoshot_barrier", static_cast<int>(Algorithm::kTwoShotBarrier)},
  };
  return t;
}

const std::vector<CodeName>& dtype_codes() {
  static const std::vector<CodeName> t = {{"float32", static_cast<int>(DType::kF32)},
                                          {"bfloat16", static_cast<int>(DType::kBF16)},
                                          {"float16", static_cast<int>(DType::kF16)},
                                          {"int32", static_cast<int>(DType::kI32)}};
  return t;
}

const std::vector<CodeName>& op_codes() {
  static const std::vector<CodeName> t = {{"sum", static_cast<int>(ReduceOp::kSum)},
                                          {"max", static_cast<int>(ReduceOp::kMax)},
                                          {"min", static_cast<int>(ReduceOp::kMin)}};
  return t;
}

const std::vector<CodeName>& collective_codes() {
  static const std::vector<CodeName> t = {
      {"all_reduce", static_cast<int>(Collective::kAllReduce)},
      {"all_reduce_rmsnorm", static_cast<int>(Collective::kRmsNorm)},
      {"all_gather", static_cast<int>(Collective::kAllGather)},
      {"psum_scatter", static_cast<int>(Collective::kReduceScatter)},
      {"ppermute", static_cast<int>(Collective::kPermute)},
      {"all_to_all", static_cast<int>(Collective::kAllToAll)},
      {"ragged_all_to_all", static_cast<int>(Collective::kRaggedAllToAll)}};
  return t;
}

uint64_t call_signature(Algorithm algorithm, DType dtype, ReduceOp op, int64_t count) {
  return encode_signature(static_cast<uint32_t>(Collective::kAllReduce),
                          static_cast<uint32_t>(algorithm), static_cast<uint32_t>(dtype),
                          static_cast<uint32_t>(op), count);
}

namespace {

std::string name_of(const std::vector<CodeName>& table, uint32_t code) {
  for (const CodeName& c : table) {
    if (static_cast<uint32_t>(c.code) == code) return c.name;
  }
  return "code " + std::to_string(code);
}

}  // namespace

std::string describe_signature(uint64_t sig) {
  const DecodedSignature d = decode_signature(sig);
  const std::string dtype = name_of(dtype_codes(), d.dtype);
  if (d.collective == static_cast<uint32_t>(Collective::kRmsNorm)) {
    return "all_reduce_rmsnorm of " + std::to_string(d.count >> 20) + " x " +
           std::to_string(d.count & 0xFFFFF) + " " + dtype +
           " elements (tokens x hidden, modulo 2^20), algorithm fused, plan " +
           std::to_string(d.op) + " (the cut into blocks, which depends on the device)";
  }
  if (d.collective == static_cast<uint32_t>(Collective::kAllGather) ||
      d.collective == static_cast<uint32_t>(Collective::kReduceScatter)) {
    return name_of(collective_codes(), d.collective) + " of pieces of " + std::to_string(d.count) +
           " " + dtype + " elements, algorithm " + name_of(algorithm_codes(), d.algorithm);
  }
  if (d.collective == static_cast<uint32_t>(Collective::kPermute)) {
    return "ppermute of " + std::to_string(d.count) + " " + dtype + " elements, algorithm " +
           name_of(algorithm_codes(), d.algorithm) + ", permutation tag " + std::to_string(d.op);
  }
  if (d.collective == static_cast<uint32_t>(Collective::kAllToAll)) {
    return "all_to_all of pieces of " + std::to_string(d.count) + " " + dtype +
           " elements, algorithm " + name_of(algorithm_codes(), d.algorithm) + ", layout " +
           std::to_string(d.op);
  }
  if (d.collective == static_cast<uint32_t>(Collective::kRaggedAllToAll)) {
    return "ragged_all_to_all of at most " + std::to_string(d.count) + " 8-byte units of " +
           dtype + " a peer, algorithm " + name_of(algorithm_codes(), d.algorithm) +
           ", layout " + std::to_string(d.op) + " (slices a peer and row size)";
  }
  const std::string what =
      d.collective == 0 ? "all_reduce" : "collective " + std::to_string(d.collective);
  return what + " of " + std::to_string(d.count) + " " + dtype + " elements, op " +
         name_of(op_codes(), d.op) + ", algorithm " + name_of(algorithm_codes(), d.algorithm);
}

}  // namespace jaxll
