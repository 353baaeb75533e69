// All-reduce + residual add + RMSNorm in one kernel, on the one-shot LL16 path.
//
// Each block owns whole rows (tokens): block b takes rows b, b + G, ... (G the
// grid). A row goes in chunks of at most one LL16 region (one round, one epoch
// each): every rank pushes its chunk of x to every peer, reduces the N chunks in
// rank order (bitwise the result jaxll.all_reduce gives), adds the residual in
// float32 and rounds once (new_residual), and accumulates the squares of the
// rounded values. When a row's last chunk is done the block reduces the sum of
// squares and writes normed = round(new_residual * rsqrt(mean + eps)) * weight,
// reading new_residual back (written by this block). Scratch alternates by epoch
// parity, as in the one-shot all-reduce (all_reduce_common.cuh); call signatures
// are checked the same way (collective code 1).
#include <algorithm>

#include "all_reduce_common.cuh"
#include "all_reduce_kernels.h"

namespace jaxll {
namespace {

constexpr uint32_t kRmsNormCollective = 1;

struct RmsNormArgs {
  AllReduceArgs base;  // view, signature and trigger (the other fields unused)
  const void* x;
  const void* residual;
  const void* weight;
  void* normed;
  void* new_residual;
  int64_t tokens;
  int64_t hidden;
  int64_t row_units;    // LL16 units (8 bytes) of a row
  int64_t chunk_units;  // most units of a row one round moves
  float eps;
};

template <class T>
__device__ __forceinline__ void poison_rows(const RmsNormArgs& a, int64_t first_row) {
  T* nr = static_cast<T*>(a.new_residual);
  T* no = static_cast<T*>(a.normed);
  for (int64_t row = first_row; row < a.tokens; row += gridDim.x)
    for (int64_t u = threadIdx.x; u < a.row_units; u += blockDim.x) {
      store_unit<T, 8>(nr + row * a.hidden, u, a.hidden, false, poison_unit<8>());
      store_unit<T, 8>(no + row * a.hidden, u, a.hidden, false, poison_unit<8>());
    }
}

// The sum of `v` over the block (every thread gets it; every thread must call).
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float s_part[kBlockThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // s_part is free (an earlier call has finished reading it)
  if (lane == 0) s_part[warp] = v;
  __syncthreads();
  float t = 0.f;
  const int warps = (blockDim.x + 31) / 32;
  for (int w = 0; w < warps; ++w) t += s_part[w];  // the same order in every thread
  return t;
}

template <class T>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSM) rmsnorm_kernel(RmsNormArgs a) {
  using Tr = ElemTraits<T>;
  constexpr int E = 8 / static_cast<int>(sizeof(T));
  const RankView& v = a.base.view;
  const int n = v.nranks;
  const T* x = static_cast<const T*>(a.x);
  const T* res = static_cast<const T*>(a.residual);
  const T* w = static_cast<const T*>(a.weight);
  T* nres = static_cast<T*>(a.new_residual);
  T* normed = static_cast<T*>(a.normed);
  const bool vec = ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(res) |
                     reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(nres) |
                     reinterpret_cast<uintptr_t>(normed)) % 8) == 0;
  collective_prologue(a.base);

  const int64_t G = gridDim.x;
  const int64_t my_rows = a.tokens > blockIdx.x ? (a.tokens - blockIdx.x + G - 1) / G : 0;
  const int64_t chunks = (a.row_units + a.chunk_units - 1) / a.chunk_units;
  const BlockStart bs = block_begin(v, static_cast<uint32_t>(my_rows * chunks));
  if (bs.had_error) {
    poison_rows<T>(a, blockIdx.x);
    return;
  }
  const int sig_lane = !v.signatures || n == 1 ? 0 : signature_lane(n);
  send_signature(a.base, sig_lane, n, bs);
  bool ok = signature_ok(a.base, sig_lane, n, bs);
  uint32_t round = 0;
  for (int64_t r = 0; r < my_rows; ++r) {
    const int64_t row = blockIdx.x + r * G;
    const T* xr = x + row * a.hidden;
    const T* rr = res + row * a.hidden;
    T* nr = nres + row * a.hidden;
    float squares = 0.f;
    for (int64_t c = 0; c < chunks; ++c, ++round) {
      const uint64_t epoch = bs.epoch + round;
      const int parity = static_cast<int>(epoch & 1);
      const Channel<Proto::kLL, T> ch(v, 0, static_cast<int>(blockIdx.x), parity, epoch);
      if (ll16_refresh_due(epoch)) ll_refresh(v, epoch, parity);
      const int64_t u0 = c * a.chunk_units;
      const int len = static_cast<int>(min(a.row_units - u0, a.chunk_units));
      for (int i = threadIdx.x; i < len; i += blockDim.x)
        send_to_peers<0>(ch, n, i, load_unit<T, 8>(xr, u0 + i, a.hidden, vec));
      for (int i = threadIdx.x; i < len; i += blockDim.x) {
        const Unit<8> own = load_unit<T, 8>(xr, u0 + i, a.hidden, vec);
        Unit<8> sum;
        if (ok) ok = reduce_slot<0, Proto::kLL, T, SumOp, 8>(ch, n, i, own, &sum);
        Unit<8> out = poison_unit<8>();
        if (ok) {
          const Unit<8> rv = load_unit<T, 8>(rr, u0 + i, a.hidden, vec);
          T s[E], q[E], o[E];
          memcpy(s, &sum.p[0], 8);
          memcpy(q, &rv.p[0], 8);
#pragma unroll
          for (int k = 0; k < E; ++k) {
            o[k] = Tr::from_acc(Tr::to_acc(s[k]) + Tr::to_acc(q[k]));
            const float h = Tr::to_acc(o[k]);
            squares += h * h;
          }
          memcpy(&out.p[0], o, 8);
        }
        store_unit<T, 8>(nr, u0 + i, a.hidden, vec, out);
      }
      if (round_boundary(ok)) {  // (also orders this chunk's new_residual for the norm pass)
        poison_rows<T>(a, blockIdx.x);
        return;
      }
    }
    // The norm of the row: new_residual (this block wrote it) times the inverse
    // root mean square, rounded, times the weight.
    const float inv = rsqrtf(block_sum(squares) / static_cast<float>(a.hidden) + a.eps);
    T* no = normed + row * a.hidden;
    for (int64_t u = threadIdx.x; u < a.row_units; u += blockDim.x) {
      const Unit<8> hv = load_unit<T, 8>(nr, u, a.hidden, vec);
      const Unit<8> wv = load_unit<T, 8>(w, u, a.hidden, vec);
      T h[E], wt[E], o[E];
      memcpy(h, &hv.p[0], 8);
      memcpy(wt, &wv.p[0], 8);
#pragma unroll
      for (int k = 0; k < E; ++k) {
        const T scaled = Tr::from_acc(Tr::to_acc(h[k]) * inv);
        o[k] = Tr::from_acc(Tr::to_acc(scaled) * Tr::to_acc(wt[k]));
      }
      Unit<8> out;
      memcpy(&out.p[0], o, 8);
      store_unit<T, 8>(no, u, a.hidden, vec, out);
    }
  }
  if (block_failed(ok)) poison_rows<T>(a, blockIdx.x);
}

template <class T>
const void* rmsnorm_fn() {
  return reinterpret_cast<const void*>(&rmsnorm_kernel<T>);
}

const void* rmsnorm_kernel_for(DType dtype) {
  switch (dtype) {
    case DType::kF32: return rmsnorm_fn<float>();
    case DType::kBF16: return rmsnorm_fn<__nv_bfloat16>();
    case DType::kF16: return rmsnorm_fn<__half>();
    default: return nullptr;
  }
}

}  // namespace

std::vector<const void*> rmsnorm_kernel_functions() {
  return {rmsnorm_fn<float>(), rmsnorm_fn<__nv_bfloat16>(), rmsnorm_fn<__half>()};
}

const char* rmsnorm_unsupported(DType dtype, int64_t hidden, const RankView& view) {
  if (rmsnorm_kernel_for(dtype) == nullptr) return "element type (float32, bfloat16, float16)";
  if (hidden <= 0 || (hidden * dtype_bytes(dtype)) % 8 != 0) {
    return "hidden size (its bytes must be a multiple of 8)";
  }
  if (view.geo.region_bytes < 8 || view.max_blocks < 1) return "workspace geometry";
  return nullptr;
}

cudaError_t launch_all_reduce_rmsnorm(DType dtype, const RankView& view, const void* x,
                                      const void* residual, const void* weight, void* normed,
                                      void* new_residual, int64_t tokens, int64_t hidden,
                                      float eps, cudaStream_t stream) {
  const void* fn = rmsnorm_kernel_for(dtype);
  if (fn == nullptr || rmsnorm_unsupported(dtype, hidden, view) != nullptr) {
    return cudaErrorInvalidValue;
  }
  if (tokens <= 0) return cudaSuccess;
  RmsNormArgs a{};
  a.base.view = view;
  a.x = x;
  a.residual = residual;
  a.weight = weight;
  a.normed = normed;
  a.new_residual = new_residual;
  a.tokens = tokens;
  a.hidden = hidden;
  a.row_units = hidden * dtype_bytes(dtype) / 8;
  a.chunk_units = std::min<int64_t>(a.row_units, view.geo.region_bytes / 8);
  a.eps = eps;
  a.base.signature = encode_signature(kRmsNormCollective, static_cast<uint32_t>(Algorithm::kOneShotLL),
                                      static_cast<uint32_t>(dtype), 0,
                                      tokens * hidden);
  const int64_t blocks = std::min<int64_t>({tokens, view.max_blocks, view.geo.blocks});
  const int64_t work = std::min<int64_t>(a.chunk_units, kBlockThreads);
  const int64_t sig_warp = view.nranks > 1 && view.signatures ? 32 : 0;
  const int threads = static_cast<int>(std::min<int64_t>(kBlockThreads, ((work + 31) / 32) * 32 + sig_warp));
  const bool pdl = launches_early(view, blocks);
  a.base.trigger = pdl ? 1 : 0;
  return launch_collective(fn, blocks, threads, pdl, &a, stream);
}

}  // namespace jaxll
