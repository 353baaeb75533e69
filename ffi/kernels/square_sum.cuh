// A row's sum of squares that does not depend on the order of its additions.
//
// The fused kernel's cut (how many blocks share a row, how many threads a
// block has, which exchange moves the units) changes with the token count,
// the group, the device and the exchange. A float sum would take the cut's
// order and round differently with each. SquareSum adds exactly instead, on a
// grid fixed for all floats, so every cut gives a row the same bits: only the
// multiset of squares decides.
//
// A float32 value is m * 2^q with an integer m < 2^24; on the grid its bits
// sit at positions q + 149 ... q + 172 (position 0: 2^-149, the smallest
// subnormal). Bins are 32 positions wide (bin j: positions 32j .. 32j + 31),
// and a value's bits fall into at most two neighbouring bins. A SquareSum
// keeps the three bins from its top bin down (`top`: the highest bin any value
// added has reached) as unsigned integers, each the exact sum of every added
// value's bits in that bin; the bits of lower bins are dropped. Raising the top
// drops the lowest bins, which is the same as never having added those bits,
// so adds and merges in any order and grouping give the same SquareSum.
// What is dropped is below 2^-64 of the largest square for each square added:
// the total is within hidden * 2^-64 of exact, relative to the largest square,
// before it is rounded once to float (to_float).
//
// Infinities and NaNs: the sum is inf if a square is inf and none is NaN, NaN
// if any is (as a float sum of them would be).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define JAXLL_SQUARE_SUM_FN __host__ __device__ __forceinline__
#else
#define JAXLL_SQUARE_SUM_FN inline
#endif

namespace jaxll {

struct SquareSum {
  // Top bin (0..8 for finite squares), kEmpty for a sum of nothing, kInf or kNan.
  int32_t top;
  // bins top, top - 1, top - 2: exact sums of the added values' bits there.
  uint64_t bin[3];

  static constexpr int32_t kEmpty = -1;
  static constexpr int32_t kInf = 9;
  static constexpr int32_t kNan = 10;

  JAXLL_SQUARE_SUM_FN static SquareSum empty() { return SquareSum{kEmpty, {0, 0, 0}}; }

  // Raises the top bin to `to` (>= top): the bins below to - 2 fall away.
  JAXLL_SQUARE_SUM_FN void raise(int32_t to) {
    const int32_t d = to - top;
    const uint64_t b0 = bin[0], b1 = bin[1];
    bin[0] = d == 0 ? b0 : 0;
    bin[1] = d == 0 ? b1 : d == 1 ? b0 : 0;
    bin[2] = d == 0 ? bin[2] : d == 1 ? b1 : d == 2 ? b0 : 0;
    top = to;
  }

  // Adds `v` (a square: >= 0, or inf, or NaN).
  JAXLL_SQUARE_SUM_FN void add(float v) {
    const float one[1] = {v};
    add_all<1>(one);
  }

  // Adds the E values of `v` (squares), their bins found independently and
  // the top raised once, so that the adds form short chains.
  template <int E>
  JAXLL_SQUARE_SUM_FN void add_all(const float (&v)[E]) {
    int32_t to = top, at_bin[E];
    uint64_t lo[E], hi[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const uint32_t bits = float_bits(v[e]);
      const uint32_t exp = (bits >> 23) & 0xFF;
      const uint32_t frac = bits & 0x7FFFFF;
      lo[e] = hi[e] = 0;
      at_bin[e] = -64;  // (no bin: a zero, inf or NaN)
      if (exp == 0xFF) {
        const int32_t special = frac ? kNan : kInf;
        to = to > special ? to : special;
      } else if ((exp | frac) != 0) {
        const uint64_t m = exp ? (frac | 0x800000u) : frac;
        const int32_t low = exp ? static_cast<int32_t>(exp) - 1 : 0;  // position of m's bit 0
        const int32_t high_bin = (low + 23) >> 5;                     // the bin of its top bit
        to = to > high_bin ? to : high_bin;
        const uint64_t shifted = m << (low & 31);  // < 2^55: bins low / 32 and the next
        lo[e] = shifted & 0xFFFFFFFFull;
        hi[e] = shifted >> 32;
        at_bin[e] = low >> 5;
      }
    }
    if (to >= kInf) {
      top = to;
      return;
    }
    raise(to);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int32_t at = top - at_bin[e];  // slot of the value's low bin (0..2, else dropped)
      bin[0] += (at == 0 ? lo[e] : 0) + (at == 1 ? hi[e] : 0);
      bin[1] += (at == 1 ? lo[e] : 0) + (at == 2 ? hi[e] : 0);
      bin[2] += (at == 2 ? lo[e] : 0) + (at == 3 ? hi[e] : 0);
    }
  }

  // Adds another sum.
  JAXLL_SQUARE_SUM_FN void merge(SquareSum o) {
    const int32_t to = top > o.top ? top : o.top;
    if (to >= kInf) {
      top = to;
      return;
    }
    if (to == kEmpty) return;
    raise(to);
    o.raise(to);
    bin[0] += o.bin[0];
    bin[1] += o.bin[1];
    bin[2] += o.bin[2];
  }

  // The sum, rounded to float (through double: the bins are exact below 2^53
  // each, which holds for rows of fewer than 2^21 values).
  JAXLL_SQUARE_SUM_FN float to_float() const {
    if (top == kEmpty) return 0.f;
    if (top >= kInf) return from_bits(top == kInf ? 0x7F800000u : 0x7FFFFFFFu);
    // bin j's unit is 2^(32j - 149)
    double s = 0.0;
#pragma unroll
    for (int k = 2; k >= 0; --k) {
      const int32_t j = top - k;
      if (j < 0) continue;
      s += static_cast<double>(bin[k]) * scale(32 * j - 149);
    }
    return static_cast<float>(s);
  }

 private:
  JAXLL_SQUARE_SUM_FN static uint32_t float_bits(float v) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(v);
#else
    uint32_t bits;
    memcpy(&bits, &v, 4);
    return bits;
#endif
  }
  JAXLL_SQUARE_SUM_FN static float from_bits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(bits);
#else
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
  }
  // 2^e for -213 <= e <= 127 + 32, as a double.
  JAXLL_SQUARE_SUM_FN static double scale(int32_t e) {
    const uint64_t bits = static_cast<uint64_t>(e + 1023) << 52;
#if defined(__CUDA_ARCH__)
    return __longlong_as_double(static_cast<long long>(bits));
#else
    double d;
    memcpy(&d, &bits, 8);
    return d;
#endif
  }
};

#if defined(__CUDACC__)
// Words of a SquareSum as 32-bit values (its top, then its bins' halves, low
// first), for packets and shared memory.
constexpr int kSquareSumWords = 7;

__device__ __forceinline__ uint32_t square_sum_word(const SquareSum& s, int w) {
  switch (w) {  // (no indexing by a run-time value: the bins stay in registers)
    case 0: return static_cast<uint32_t>(s.top);
    case 1: return static_cast<uint32_t>(s.bin[0]);
    case 2: return static_cast<uint32_t>(s.bin[0] >> 32);
    case 3: return static_cast<uint32_t>(s.bin[1]);
    case 4: return static_cast<uint32_t>(s.bin[1] >> 32);
    case 5: return static_cast<uint32_t>(s.bin[2]);
    default: return static_cast<uint32_t>(s.bin[2] >> 32);
  }
}

// The SquareSum of words w[0 .. kSquareSumWords).
__device__ __forceinline__ SquareSum square_sum_of(const uint32_t* w) {
  auto pair = [](uint32_t lo, uint32_t hi) { return (static_cast<uint64_t>(hi) << 32) | lo; };
  return SquareSum{static_cast<int32_t>(w[0]), {pair(w[1], w[2]), pair(w[3], w[4]), pair(w[5], w[6])}};
}

// The merge of every lane's sum over the warp (every lane gets it; every lane
// must call). Every lane raises its sum to the warp's top, then each bin is
// summed in three 22-bit limbs by the warp's integer reduction (sums of 32
// limbs stay below 2^27: exact), which is shorter than a tree of merges.
__device__ __forceinline__ SquareSum warp_square_sum(SquareSum s) {
  const int32_t top = __reduce_max_sync(0xffffffffu, s.top);
  if (top >= SquareSum::kInf || top == SquareSum::kEmpty) {
    return SquareSum{top, {0, 0, 0}};
  }
  s.raise(top);
  SquareSum out{top, {0, 0, 0}};
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    constexpr uint64_t kLimb = (1u << 22) - 1;
    const uint64_t l0 = __reduce_add_sync(0xffffffffu, static_cast<uint32_t>(s.bin[k] & kLimb));
    const uint64_t l1 =
        __reduce_add_sync(0xffffffffu, static_cast<uint32_t>((s.bin[k] >> 22) & kLimb));
    const uint64_t l2 = __reduce_add_sync(0xffffffffu, static_cast<uint32_t>(s.bin[k] >> 44));
    out.bin[k] = l0 + (l1 << 22) + (l2 << 44);
  }
  return out;
}
#endif

}  // namespace jaxll
