// Which kernel runs a fused call's plan, written once for the production
// kernels (all_reduce_rmsnorm.cu) and for any other instantiation of the same
// bodies (ffi/testing's twins for a virtual group's one launch).
//
// General<T>::fn(), Decode<T, NR, P>::fn() and TwoShot<T, NR, P, K>::fn() name
// the instances: the general kernel, the decode-shape kernel (groups of 2, 4
// and 8 compiled apart, 0: any) and the two-shot kernel (groups of 4 and 8
// apart; K units a thread).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/rmsnorm.h"

namespace jaxll {

template <template <class> class General, template <class, int, Proto> class Decode,
          template <class, int, Proto, int> class TwoShot>
struct RmsNormKernels {
  // The general kernel of `dtype` (null for a type without one).
  static const void* general(DType dtype) {
    switch (dtype) {
      case DType::kF32: return General<float>::fn();
      case DType::kBF16: return General<__nv_bfloat16>::fn();
      case DType::kF16: return General<__half>::fn();
      default: return nullptr;
    }
  }
  // The kernel that runs `plan` for a group of `nranks`.
  static const void* of(const RmsNormPlan& plan, DType dtype, int nranks) {
    switch (dtype) {
      case DType::kF32: return typed<float>(plan, nranks);
      case DType::kBF16: return typed<__nv_bfloat16>(plan, nranks);
      case DType::kF16: return typed<__half>(plan, nranks);
      default: return nullptr;
    }
  }
  // Every kernel, each once.
  static std::vector<const void*> all() {
    std::vector<const void*> out;
    append<float>(out);
    append<__nv_bfloat16>(out);
    append<__half>(out);
    return out;
  }

 private:
  template <class T, Proto P>
  static const void* decode(int nranks) {
    switch (nranks) {
      case 2: return Decode<T, 2, P>::fn();
      case 4: return Decode<T, 4, P>::fn();
      case 8: return Decode<T, 8, P>::fn();
      default: return Decode<T, 0, P>::fn();
    }
  }
  template <class T, Proto P, int K>
  static const void* twoshot(int nranks) {
    switch (nranks) {
      case 4: return TwoShot<T, 4, P, K>::fn();
      case 8: return TwoShot<T, 8, P, K>::fn();
      default: return TwoShot<T, 0, P, K>::fn();
    }
  }
  template <class T, Proto P>
  static const void* twoshot(int nranks, int units) {
    return units > 1 ? twoshot<T, P, kRmsNormTwoShotUnits>(nranks) : twoshot<T, P, 1>(nranks);
  }
  template <class T>
  static const void* typed(const RmsNormPlan& plan, int nranks) {
    const bool sentinel = plan.proto == Proto::kSentinel;
    if (plan.twoshot) {
      return sentinel ? twoshot<T, Proto::kSentinel>(nranks, plan.units)
                      : twoshot<T, Proto::kLL>(nranks, plan.units);
    }
    if (plan.lean) {
      return sentinel ? decode<T, Proto::kSentinel>(nranks) : decode<T, Proto::kLL>(nranks);
    }
    return General<T>::fn();
  }
  template <class T>
  static void append(std::vector<const void*>& out) {
    out.push_back(General<T>::fn());
    for (int nr : {0, 2, 4, 8}) {
      out.push_back(decode<T, Proto::kLL>(nr));
      out.push_back(decode<T, Proto::kSentinel>(nr));
    }
    for (int nr : {0, 4, 8}) {
      for (int units : {1, kRmsNormTwoShotUnits}) {
        out.push_back(twoshot<T, Proto::kLL>(nr, units));
        out.push_back(twoshot<T, Proto::kSentinel>(nr, units));
      }
    }
  }
};

}  // namespace jaxll
