// Two-shot LL128-atomic all-reduce (sum; f32, f16, bf16): the reduce-scatter is
// done by vector atomic adds into the owner's scratch lines (see
// jaxll/ll128_atomic.cuh), the all-gather by the sentinel protocol.
//
// Units are 128-byte lines of 31 f32 / 63 f16 or bf16 elements. In each round a
// block's piece of L lines is cut into N chunks of c = ceil(L/N) lines (padded);
// a group of 8 threads moves one line, 16 bytes per thread. Every rank adds its
// chunk j into rank j's lines and then bumps their counters; rank j waits for
// counters equal to N, clears the lines, and pushes the sums to every peer.
// Sums depend on the order in which the adds land: not reproducible run to run,
// but identical on every rank (all ranks take the owner's result).
#pragma once

#include "kernels/call_args.cuh"

namespace jaxll {

// One block of the LL128-atomic all-reduce of `a`.
template <class T>
__device__ __forceinline__ void twoshot_atomic_all_reduce(const AllReduceArgs& a) {
  using S = LL128Slice<T>;
  const RankView& v = a.view;
  const int rank = v.rank;
  const int n = v.nranks;
  const T* x = static_cast<const T*>(a.in);
  T* y = static_cast<T*>(a.out);
  const int lane = threadIdx.x & 7;
  const int group = threadIdx.x >> 3;
  const int groups = blockDim.x >> 3;
  const int b = static_cast<int>(blockIdx.x);
  const BlockShare share = block_share(a);
  const uint4 poison = make_uint4(~0u, ~0u, ~0u, ~0u);
  collective_prologue(a);

  const BlockStart bs = block_begin(v, share.rounds);
  if (bs.had_error) {
    for (int64_t l = share.u0 + group; l < share.u1; l += groups)
      S::store(y, l, lane, a.count, poison);
    return;
  }
  const int sig_lane = v.signatures ? signature_lane(n) : 0;
  send_signature(a, sig_lane, n, bs);
  const LL128Lines<T> lines(v, b, n);
  bool ok = signature_ok(a, sig_lane, n, bs);
  for (uint32_t r = 0; r < share.rounds; ++r) {
    const uint64_t epoch = bs.epoch + r;
    const int parity = static_cast<int>(epoch & 1);
    const int64_t r0 = share.u0 + static_cast<int64_t>(r) * a.round_units;
    const int64_t r1 = min(share.u1, r0 + a.round_units);
    const int64_t c = (r1 - r0 + n - 1) / n;
    const WaitContext ctx = wait_context(v, epoch);

    // Reduce-scatter: add chunk j (lines r0 + j*c + k) into rank j's lines k,
    // then, once those adds are ordered, count this rank in.
    for (int64_t i = group; i < n * c; i += groups) {
      const int k = static_cast<int>(i / c);
      const int owner = peer_at(rank, k, n);
      const int64_t t = i - k * c;
      const int64_t line = r0 + owner * c + t;
      const uint4 q = line < r1 ? S::load(x, line, lane, a.count) : make_uint4(0, 0, 0, 0);
      lines.add(lines.line(owner, parity, t), lane, q);
    }
    // Every lane's adds are ordered before the warp barrier; lane 7's fence
    // after it is cumulative over them, so the counter bump releases them all.
    __syncwarp();
    if (lane == 7) {
      fence_sys();
      for (int64_t i = group; i < n * c; i += groups) {
        const int k = static_cast<int>(i / c);
        const int owner = peer_at(rank, k, n);
        const int64_t t = i - k * c;
        lines.arrive(lines.line(owner, parity, t));
      }
    }

    // Owner: wait for N arrivals per line, take the sum, clear the line, send it on.
    for (int64_t t = group; t < c; t += groups) {
      char* line_base = lines.line(rank, parity, t);
      const uint32_t* counter = lines.counter(line_base);
      if (ok) {
        ok = bounded_wait(ctx, static_cast<uint32_t>(rank), [&] { return lines.complete(counter); });
      }
      uint4 q = poison;
      if (ok) {
        lines.take(line_base, lane, &q);
        q = sentinel_canonicalize_16<T>(q);
        for (int k = 1; k < n; ++k)
          st_relaxed_16(sentinel_region(v, peer_at(rank, k, n), 1, b, parity, rank) +
                            t * kLineBytes + lane * 16,
                        q);
      }
      const int64_t line = r0 + rank * c + t;
      if (line < r1) S::store(y, line, lane, a.count, q);
    }

    // All-gather: the other owners' sums, through sentinel scratch.
    for (int64_t i = group; i < (n - 1) * c; i += groups) {
      const int k = static_cast<int>(i / c) + 1;
      const int owner = peer_at(rank, k, n);
      const int64_t t = i - (k - 1) * c;
      char* p = sentinel_region(v, rank, 1, b, parity, owner) + t * kLineBytes + lane * 16;
      uint64_t lo = 0, hi = 0;
      if (ok) {
        ok = bounded_wait(ctx, static_cast<uint32_t>(owner),
                          [&] { return sentinel_slot_probe<T>(p, &lo, &hi); });
        if (ok) sentinel_slot_release(p);
      }
      const uint4 q = ok ? make_uint4(static_cast<uint32_t>(lo), static_cast<uint32_t>(lo >> 32),
                                      static_cast<uint32_t>(hi), static_cast<uint32_t>(hi >> 32))
                         : poison;
      const int64_t line = r0 + owner * c + t;
      if (line < r1) S::store(y, line, lane, a.count, q);
    }
    if (r + 1 < share.rounds && round_boundary(ok)) {
      // (earlier rounds too)
      for (int64_t l = share.u0 + group; l < share.u1; l += groups) S::store(y, l, lane, a.count, poison);
      return;
    }
  }
  if (block_failed(ok)) {
    for (int64_t l = share.u0 + group; l < share.u1; l += groups)
      S::store(y, l, lane, a.count, poison);
  }
}

}  // namespace jaxll
