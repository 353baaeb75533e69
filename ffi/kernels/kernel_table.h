// The table of compiled all-reduce kernels (internal to the kernel library and
// the tools that launch its kernels).
//
// Each kernel file registers its template instances under (family, protocol,
// dtype, op, group size); a launch looks them up, so adding a variant touches
// one file. The table also lists every kernel for loading and occupancy queries.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <vector>

#include "jaxll/protocol.h"
#include "kernels/types.h"

namespace jaxll {

enum class Family { kOneShot, kTwoShot, kTwoShotAtomic };

// Group sizes with sum kernels compiled for exactly that many ranks (their
// loops over peers unroll); every other size, and max and min, use the NR = 0
// instance (any n). One rank is a group too: a forced kernel on a one-device
// mesh runs it.
constexpr int kSpecializedRanks[] = {1, 2, 4, 8};
constexpr int kRankVariants = 1 + static_cast<int>(sizeof(kSpecializedRanks) / sizeof(int));

// Index of the rank-count variant for a compile-time NR (0 = any n).
constexpr int rank_variant(int nr) {
  for (int i = 0; i < kRankVariants - 1; ++i)
    if (kSpecializedRanks[i] == nr) return i + 1;
  return 0;
}

struct KernelEntry {
  Family family;
  Proto proto;
  DType dtype;
  ReduceOp op;
  int ranks;  // compiled for exactly this group size; 0 = any
  const void* fn;
};

// Kernels indexed by (family, protocol, dtype, op, rank-count variant): a
// lookup per launch is two array reads.
class KernelTable {
 public:
  KernelTable() {
    for (int& s : slots_) s = -1;
  }
  void add(Family f, Proto p, DType d, ReduceOp o, int ranks, const void* fn) {
    entries_.push_back({f, p, d, o, ranks, fn});
    slots_[slot(f, p, d, o, rank_variant(ranks))] = static_cast<int>(entries_.size()) - 1;
  }
  // The kernel for a group of `nranks`: its own instance where one is
  // compiled, else the one for any group size (nullptr if neither exists).
  const KernelEntry* find(Family f, Proto p, DType d, ReduceOp o, int nranks) const {
    const int i = slot(f, p, d, o, rank_variant(nranks));
    if (i >= 0 && slots_[i] >= 0) return &entries_[slots_[i]];
    const int any = slot(f, p, d, o, 0);
    return any < 0 || slots_[any] < 0 ? nullptr : &entries_[slots_[any]];
  }
  const std::vector<KernelEntry>& entries() const { return entries_; }

 private:
  static constexpr int kFamilies = 3, kProtos = 3, kDTypes = 4, kOps = 3;
  static int slot(Family f, Proto p, DType d, ReduceOp o, int variant) {
    const int fi = static_cast<int>(f), pi = static_cast<int>(p);
    const int di = static_cast<int>(d), oi = static_cast<int>(o);
    if (fi < 0 || fi >= kFamilies || pi < 0 || pi >= kProtos || di < 0 || di >= kDTypes ||
        oi < 0 || oi >= kOps || variant < 0 || variant >= kRankVariants)
      return -1;
    return (((fi * kProtos + pi) * kDTypes + di) * kOps + oi) * kRankVariants + variant;
  }
  std::vector<KernelEntry> entries_;
  int slots_[kFamilies * kProtos * kDTypes * kOps * kRankVariants];  // entries_ index, -1: none
};

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

template <class T>
struct TypeTag {
  using type = T;
};
template <Proto P>
struct ProtoTag {
  static constexpr Proto value = P;
};

// The (protocol, dtype, op) combinations the one-shot and two-shot families
// compile: LL16 for every dtype and op, sentinel for the float dtypes and every
// op, the barrier baselines for sum; each for any group size, and sums also for
// each of kSpecializedRanks (max and min, rare in models, keep to the any-size
// instance: specializing them too would nearly double these files' build
// time). `Kernel<P, T, Op, NR>::fn()` names the instance (the production
// kernel, or in ffi/testing its twin for a virtual group's launch).
template <template <Proto, class, class, int> class Kernel>
void register_family(KernelTable& t, Family f) {
  auto one = [&](auto proto, auto dtype, auto op) {
    using T = typename decltype(dtype)::type;
    using Op = typename decltype(op)::type;
    constexpr Proto P = decltype(proto)::value;
    auto add = [&](int nr, const void* fn) { t.add(f, P, dtype_of<T>(), op_of<Op>(), nr, fn); };
    add(0, Kernel<P, T, Op, 0>::fn());
    if constexpr (op_of<Op>() == ReduceOp::kSum) {
      add(1, Kernel<P, T, Op, 1>::fn());
      add(2, Kernel<P, T, Op, 2>::fn());
      add(4, Kernel<P, T, Op, 4>::fn());
      add(8, Kernel<P, T, Op, 8>::fn());
    }
  };
  auto ops = [&](auto proto, auto dtype) {
    one(proto, dtype, TypeTag<SumOp>{});
    one(proto, dtype, TypeTag<MaxOp>{});
    one(proto, dtype, TypeTag<MinOp>{});
  };
  using LL = ProtoTag<Proto::kLL>;
  using Sentinel = ProtoTag<Proto::kSentinel>;
  using Barrier = ProtoTag<Proto::kBarrier>;
  ops(LL{}, TypeTag<float>{});
  ops(LL{}, TypeTag<__nv_bfloat16>{});
  ops(LL{}, TypeTag<__half>{});
  ops(LL{}, TypeTag<int32_t>{});
  ops(Sentinel{}, TypeTag<float>{});
  ops(Sentinel{}, TypeTag<__nv_bfloat16>{});
  ops(Sentinel{}, TypeTag<__half>{});
  one(Barrier{}, TypeTag<float>{}, TypeTag<SumOp>{});
  one(Barrier{}, TypeTag<__nv_bfloat16>{}, TypeTag<SumOp>{});
  one(Barrier{}, TypeTag<__half>{}, TypeTag<SumOp>{});
  one(Barrier{}, TypeTag<int32_t>{}, TypeTag<SumOp>{});
}

// The families' tables of production kernels (ffi/kernels/all_reduce_*.cu).
void register_oneshot_kernels(KernelTable& t);
void register_twoshot_kernels(KernelTable& t);
void register_atomic_kernels(KernelTable& t);

}  // namespace jaxll
