// A broadcast from one rank, written with jaxll's device API only: the root's
// bytes go to every peer in LL16 packets (8 bytes of data and the round's
// epoch as flag in one 16-byte store), so no flag, fence or barrier is needed.
//
// Every round also carries one token packet from every rank to every peer.
// That keeps the invariant jaxll's own kernels rely on when they reuse scratch
// (jaxll/rank_view.cuh, jaxll/round.cuh): in every round each rank hears
// from each peer something sent after the peer finished the round before, so a
// slot written at epoch e is never written again (epoch e + 2, same parity)
// before its reader is done with it, whatever kernels (this one or jaxll's
// all-reduces) used the epochs in between.
#include "broadcast_kernel.h"

#include <algorithm>

#include "jaxll/jaxll.cuh"

namespace custom_collective {
namespace {

using jaxll::LL16;
using jaxll::RankView;

constexpr int kThreads = 256;

// Unit u (8 bytes) of a message of `bytes` bytes (zero past the end).
__device__ uint64_t load_unit(const unsigned char* x, int64_t u, int64_t bytes) {
  uint64_t v = 0;
  const int64_t at = u * 8;
  if (at + 8 <= bytes && (reinterpret_cast<uintptr_t>(x) % 8) == 0) {
    return *reinterpret_cast<const uint64_t*>(x + at);
  }
  for (int k = 0; k < 8 && at + k < bytes; ++k) v |= static_cast<uint64_t>(x[at + k]) << (8 * k);
  return v;
}

__device__ void store_unit(unsigned char* y, int64_t u, int64_t bytes, uint64_t v) {
  const int64_t at = u * 8;
  if (at + 8 <= bytes && (reinterpret_cast<uintptr_t>(y) % 8) == 0) {
    *reinterpret_cast<uint64_t*>(y + at) = v;
    return;
  }
  for (int k = 0; k < 8 && at + k < bytes; ++k) y[at + k] = static_cast<unsigned char>(v >> (8 * k));
}

__global__ void __launch_bounds__(kThreads) broadcast_kernel(RankView v, const unsigned char* x,
                                                             unsigned char* y, int64_t bytes,
                                                             int64_t span, int64_t round_units,
                                                             int root) {
  const int rank = v.rank;
  const int n = v.nranks;
  const int64_t units = (bytes + 7) / 8;
  const int64_t u0 = static_cast<int64_t>(blockIdx.x) * span;
  const int64_t u1 = min(units, u0 + span);
  const uint32_t rounds = static_cast<uint32_t>((u1 - u0 + round_units - 1) / round_units);
  const jaxll::BlockStart bs = jaxll::block_begin(v, rounds);
  if (bs.had_error) {
    // an earlier call on this workspace gave up: do not communicate, poison
    for (int64_t u = u0 + threadIdx.x; u < u1; u += blockDim.x) store_unit(y, u, bytes, ~0ull);
    return;
  }
  bool ok = true;
  for (uint32_t r = 0; r < rounds; ++r) {
    const uint64_t epoch = bs.epoch + r;
    const uint32_t flag = static_cast<uint32_t>(epoch);
    const int parity = static_cast<int>(epoch & 1);
    const jaxll::WaitContext ctx = jaxll::wait_context(v, epoch);
    jaxll::ll_round_begin(v, epoch, parity);
    const int64_t r0 = u0 + static_cast<int64_t>(r) * round_units;
    const int len = static_cast<int>(min(u1 - r0, round_units));

    // 1. this round's token to every peer (phase 1, slot 0)
    const int k = static_cast<int>(threadIdx.x) + 1;  // threads 0..n-2: peer offsets 1..n-1
    if (k < n) {
      jaxll::ll16_store(jaxll::ll_region(v, jaxll::peer_at(rank, k, n), 1, blockIdx.x, parity, rank),
                        0, flag);
    }
    // 2. the data: the root stores it on every peer; the others wait for it
    for (int i = threadIdx.x; i < len; i += blockDim.x) {
      if (rank == root) {
        const uint64_t value = load_unit(x, r0 + i, bytes);
        for (int p = 1; p < n; ++p) {
          jaxll::ll16_store(jaxll::ll_region(v, jaxll::peer_at(rank, p, n), 0, blockIdx.x, parity, root) + i,
                            value, flag);
        }
        store_unit(y, r0 + i, bytes, value);
      } else {
        uint64_t value = ~0ull;
        if (ok) {
          ok = jaxll::ll16_wait(jaxll::ll_region(v, rank, 0, blockIdx.x, parity, root) + i, flag, ctx,
                                static_cast<uint32_t>(root), &value);
        }
        store_unit(y, r0 + i, bytes, ok ? value : ~0ull);
      }
    }
    // 3. every peer's token of this round
    if (k < n && ok) {
      const int src = jaxll::peer_at(rank, k, n);
      uint64_t unused;
      ok = jaxll::ll16_wait(jaxll::ll_region(v, rank, 1, blockIdx.x, parity, src), flag, ctx,
                            static_cast<uint32_t>(src), &unused);
    }
    // the block moves on together (and poisons its whole share if a wait gave up)
    if (jaxll::round_boundary(ok)) {
      for (int64_t u = u0 + threadIdx.x; u < u1; u += blockDim.x) store_unit(y, u, bytes, ~0ull);
      return;
    }
  }
}

}  // namespace

cudaError_t load_broadcast_kernel(int ordinal, int carveout) {
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  cudaError_t e = cudaSetDevice(ordinal);
  cudaFuncAttributes attr;
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, broadcast_kernel);  // loads it
  if (e == cudaSuccess && carveout >= 0) {
    e = cudaFuncSetAttribute(broadcast_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             carveout);
  }
  if (previous >= 0) cudaSetDevice(previous);
  return e;
}

cudaError_t launch_broadcast(const jaxll::RankView& view, const void* x, void* y, int64_t bytes,
                             int root, cudaStream_t stream) {
  if (bytes <= 0) return cudaSuccess;
  if (root < 0 || root >= view.nranks || view.geo.region_bytes < 8) return cudaErrorInvalidValue;
  const int64_t units = (bytes + 7) / 8;
  const int64_t cap = std::max<int64_t>(1, std::min<int64_t>(view.max_blocks, view.geo.blocks));
  int64_t blocks = std::min<int64_t>((units + kThreads - 1) / kThreads, cap);
  const int64_t span = (units + blocks - 1) / blocks;
  blocks = (units + span - 1) / span;
  const int64_t round_units = view.geo.region_bytes / 8;  // LL16 packets of one region
  broadcast_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      view, static_cast<const unsigned char*>(x), static_cast<unsigned char*>(y), bytes, span,
      round_units, root);
  return cudaGetLastError();
}

}  // namespace custom_collective
