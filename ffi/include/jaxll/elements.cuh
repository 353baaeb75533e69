// Element types, reduction operators and 8-byte packet I/O over XLA buffers.
//
// Data moves between ranks as raw 8-byte payloads; values are only interpreted
// when reduced. f16 and bf16 accumulate in f32 and are rounded once at the end;
// every rank reduces the N contributions in rank order 0..N-1, so all ranks get
// bitwise identical results.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace jaxll {

template <class T>
struct ElemTraits;

template <>
struct ElemTraits<float> {
  using Acc = float;
  using Bits = uint32_t;
  __device__ static Acc to_acc(float v) { return v; }
  __device__ static float from_acc(Acc a) { return a; }
};

template <>
struct ElemTraits<__half> {
  using Acc = float;
  using Bits = uint16_t;
  __device__ static Acc to_acc(__half v) { return __half2float(v); }
  __device__ static __half from_acc(Acc a) { return __float2half_rn(a); }
};

template <>
struct ElemTraits<__nv_bfloat16> {
  using Acc = float;
  using Bits = uint16_t;
  __device__ static Acc to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 from_acc(Acc a) { return __float2bfloat16_rn(a); }
};

template <>
struct ElemTraits<int32_t> {
  using Acc = int32_t;
  using Bits = uint32_t;
  __device__ static Acc to_acc(int32_t v) { return v; }
  __device__ static int32_t from_acc(Acc a) { return a; }
};

// Reduction operators. Float max/min propagate NaN, as XLA's do.
struct SumOp {
  __device__ static float apply(float a, float b) { return a + b; }
  __device__ static int32_t apply(int32_t a, int32_t b) {
    return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
  }
};
struct MaxOp {
  __device__ static float apply(float a, float b) { return (a != a || a > b) ? a : b; }
  __device__ static int32_t apply(int32_t a, int32_t b) { return a > b ? a : b; }
};
struct MinOp {
  __device__ static float apply(float a, float b) { return (a != a || a < b) ? a : b; }
  __device__ static int32_t apply(int32_t a, int32_t b) { return a < b ? a : b; }
};

template <class T>
__host__ __device__ constexpr int elems_per_packet() {
  return 8 / static_cast<int>(sizeof(T));
}

// Loads packet `pkt` (elements [pkt*E, pkt*E+E)) of an array of `count`
// elements as raw bits; elements past the end read as zero bits. `vec` says the
// base pointer is 8-byte aligned, allowing one 8-byte load for full packets.
template <class T>
__device__ __forceinline__ uint64_t load_packet(const T* x, int64_t pkt, int64_t count, bool vec) {
  constexpr int E = elems_per_packet<T>();
  using Bits = typename ElemTraits<T>::Bits;
  const int64_t e0 = pkt * E;
  if (vec && e0 + E <= count) return *reinterpret_cast<const uint64_t*>(x + e0);
  Bits b[E];
#pragma unroll
  for (int k = 0; k < E; ++k)
    b[k] = (e0 + k < count) ? reinterpret_cast<const Bits*>(x)[e0 + k] : Bits(0);
  uint64_t out;
  memcpy(&out, b, 8);
  return out;
}

// Stores packet `pkt` of raw bits, skipping elements past the end.
template <class T>
__device__ __forceinline__ void store_packet(T* y, int64_t pkt, int64_t count, bool vec,
                                             uint64_t bits) {
  constexpr int E = elems_per_packet<T>();
  using Bits = typename ElemTraits<T>::Bits;
  const int64_t e0 = pkt * E;
  if (vec && e0 + E <= count) {
    *reinterpret_cast<uint64_t*>(y + e0) = bits;
    return;
  }
  Bits b[E];
  memcpy(b, &bits, 8);
#pragma unroll
  for (int k = 0; k < E; ++k)
    if (e0 + k < count) reinterpret_cast<Bits*>(y)[e0 + k] = b[k];
}

// Accumulator for one packet's worth of elements.
template <class T, class Op>
struct PacketAcc {
  static constexpr int E = elems_per_packet<T>();
  using Acc = typename ElemTraits<T>::Acc;
  Acc v[E];

  // Sets the accumulator to the contribution of the first rank.
  __device__ __forceinline__ void init(uint64_t bits) {
    T t[E];
    memcpy(t, &bits, 8);
#pragma unroll
    for (int k = 0; k < E; ++k) v[k] = ElemTraits<T>::to_acc(t[k]);
  }
  // Folds in the next rank's contribution.
  __device__ __forceinline__ void add(uint64_t bits) {
    T t[E];
    memcpy(t, &bits, 8);
#pragma unroll
    for (int k = 0; k < E; ++k) v[k] = Op::apply(v[k], ElemTraits<T>::to_acc(t[k]));
  }
  __device__ __forceinline__ uint64_t result() const {
    T t[E];
#pragma unroll
    for (int k = 0; k < E; ++k) t[k] = ElemTraits<T>::from_acc(v[k]);
    uint64_t out;
    memcpy(&out, t, 8);
    return out;
  }
};

}  // namespace jaxll
