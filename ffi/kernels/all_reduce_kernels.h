// The table of compiled all-reduce kernels (internal to ffi/kernels).
//
// Each kernel file registers its template instances under (family, protocol,
// dtype, op); launch_all_reduce looks them up, so adding a variant touches one
// file. The table also lists every kernel for loading and occupancy queries.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <vector>

#include "all_reduce.h"

namespace jaxll {

enum class Family { kOneShot, kTwoShot, kTwoShotAtomic };
enum class Proto { kLL, kSentinel, kBarrier };

struct KernelEntry {
  Family family;
  Proto proto;
  DType dtype;
  ReduceOp op;
  const void* fn;
};

class KernelTable {
 public:
  void add(Family f, Proto p, DType d, ReduceOp o, const void* fn) {
    entries_.push_back({f, p, d, o, fn});
  }
  const void* find(Family f, Proto p, DType d, ReduceOp o) const {
    for (const KernelEntry& e : entries_)
      if (e.family == f && e.proto == p && e.dtype == d && e.op == o) return e.fn;
    return nullptr;
  }
  const std::vector<KernelEntry>& entries() const { return entries_; }

 private:
  std::vector<KernelEntry> entries_;
};

void register_oneshot_kernels(KernelTable& t);
void register_twoshot_kernels(KernelTable& t);
void register_atomic_kernels(KernelTable& t);

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::kF32; }
template <>
constexpr DType dtype_of<__nv_bfloat16>() { return DType::kBF16; }
template <>
constexpr DType dtype_of<__half>() { return DType::kF16; }
template <>
constexpr DType dtype_of<int32_t>() { return DType::kI32; }

struct SumOp;
struct MaxOp;
struct MinOp;
template <class Op>
constexpr ReduceOp op_of();
template <>
constexpr ReduceOp op_of<SumOp>() { return ReduceOp::kSum; }
template <>
constexpr ReduceOp op_of<MaxOp>() { return ReduceOp::kMax; }
template <>
constexpr ReduceOp op_of<MinOp>() { return ReduceOp::kMin; }

}  // namespace jaxll
