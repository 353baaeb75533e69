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

// Kernels indexed by (family, protocol, dtype, op): a lookup per launch is one
// array read.
class KernelTable {
 public:
  void add(Family f, Proto p, DType d, ReduceOp o, const void* fn) {
    entries_.push_back({f, p, d, o, fn});
    slots_[slot(f, p, d, o)] = fn;
  }
  const void* find(Family f, Proto p, DType d, ReduceOp o) const {
    const int i = slot(f, p, d, o);
    return i < 0 ? nullptr : slots_[i];
  }
  const std::vector<KernelEntry>& entries() const { return entries_; }

 private:
  static constexpr int kFamilies = 3, kProtos = 3, kDTypes = 4, kOps = 3;
  static int slot(Family f, Proto p, DType d, ReduceOp o) {
    const int fi = static_cast<int>(f), pi = static_cast<int>(p);
    const int di = static_cast<int>(d), oi = static_cast<int>(o);
    if (fi < 0 || fi >= kFamilies || pi < 0 || pi >= kProtos || di < 0 || di >= kDTypes ||
        oi < 0 || oi >= kOps)
      return -1;
    return ((fi * kProtos + pi) * kDTypes + di) * kOps + oi;
  }
  std::vector<KernelEntry> entries_;
  const void* slots_[kFamilies * kProtos * kDTypes * kOps] = {};
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
// op, the barrier baselines for sum. `Kernel<P, T, Op>::fn()` names the instance.
template <template <Proto, class, class> class Kernel>
void register_family(KernelTable& t, Family f) {
  auto one = [&](auto proto, auto dtype, auto op) {
    using T = typename decltype(dtype)::type;
    using Op = typename decltype(op)::type;
    constexpr Proto P = decltype(proto)::value;
    t.add(f, P, dtype_of<T>(), op_of<Op>(), Kernel<P, T, Op>::fn());
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

}  // namespace jaxll
