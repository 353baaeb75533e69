// Tools over virtual-rank workspaces (N ranks on one GPU, one stream each):
// a randomized stress test with an exact on-device check, and graph-based
// kernel timing. Exposed to Python as jaxll.testing.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../kernels/all_reduce.h"
#include "../runtime/workspace.h"

namespace jaxll {

struct StressResult {
  uint64_t calls = 0;
  uint64_t mismatches = 0;   // elements whose bits differ from the exact expectation
  int64_t first_call = -1;   // where the first mismatch was seen
  int first_rank = -1;
  int64_t first_index = -1;  // element index (negative: a guard element before the data)
  uint32_t got_bits = 0;
  uint32_t want_bits = 0;
  std::string error;         // non-empty if a rank recorded an error (timeout)
  std::vector<uint64_t> rank_errors;  // every rank's error word (0: none), in rank order
};

// Runs counts.size() consecutive all-reduces on every virtual rank of `ws`
// (call i uses algorithms[i % size]), each rank on its own stream with no
// synchronisation between ranks other than the all-reduce itself (random
// delays skew the ranks further). Inputs are a deterministic hash of (seed,
// call, rank, index); every output element, and guard elements around it, are
// checked on the device: bit for bit against the same reduction computed in
// rank order, or, for LL128-atomic (not reproducible), against the float64 sum
// within n * eps * sum|x| and bitwise equal across ranks.
StressResult virtual_stress(Workspace& ws, const std::vector<Algorithm>& algorithms, DType dtype,
                            ReduceOp op, const std::vector<int64_t>& counts, uint64_t seed,
                            int max_delay_us);

// Kernel time of one all-reduce, in microseconds, once per repetition: a CUDA
// graph holds `iters` consecutive calls on every rank's stream (no joins between
// calls) and is replayed `reps` times under CUDA events. With `one_launch` each
// call is every rank's in one launch (launch_all_reduce_group) on one stream.
std::vector<double> virtual_bench(Workspace& ws, Algorithm algorithm, DType dtype, ReduceOp op,
                                  int64_t count, int iters, int reps, bool one_launch = false);

// The same graph with an empty kernel per rank and call (`one_launch`: one empty
// kernel per call): the graph-node floor.
std::vector<double> virtual_floor(Workspace& ws, int iters, int reps, bool one_launch = false);

// One rank's part in virtual_calls.
struct RankCall {
  Algorithm algorithm = Algorithm::kOneShotLL;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int64_t count = 1;
  bool skip = false;      // the rank makes no call (it never arrives)
  int64_t delay_us = 0;   // the rank's stream is held this long before its call, by
  int delay_kernels = 1;  // this many one-thread kernels in a row, delay_us each, queued
                          // 2 ms after the other ranks' calls (so they must find an SM
                          // while those calls spin)
};

// Fault injection: one all-reduce per virtual rank of `ws`, each rank with
// its own arguments (ranks may disagree, skip or be late), inputs filled with
// 0x11 bytes, outputs zeroed before. Waits for every rank, then returns for
// each rank the number of its output elements that hold the poison pattern
// (all-ones bits) and whether its output was left untouched (skipped ranks).
std::vector<int64_t> virtual_calls(Workspace& ws, const std::vector<RankCall>& calls);

// The fused all-reduce + residual + RMSNorm kernel on every virtual rank of
// `ws`: x holds every rank's (tokens, hidden) block back to back (rank-major),
// residual and weight are shared; returns (normed, new_residual) of every rank,
// rank-major, as raw bytes, and the first recorded error. Rank `absent` (if
// >= 0) makes no call: the others give up, and their outputs and the error
// come back; with every rank present a recorded error throws instead. Rank
// `late` (if >= 0) queues its call 2 ms after the others, behind a one-thread
// kernel of `delay_us`.
struct RmsNormResult {
  std::string normed, new_residual, error;
};
RmsNormResult virtual_rmsnorm(Workspace& ws, DType dtype, const std::string& x,
                              const std::string& residual, const std::string& weight,
                              int64_t tokens, int64_t hidden, float eps, int absent = -1,
                              int late = -1, int64_t delay_us = 0,
                              RmsNormProtocol protocol = RmsNormProtocol::kAuto);

// One all-gather or reduce-scatter (pieces of `count` elements) on every virtual
// rank of `ws`: x holds every rank's input back to back (all-gather: one piece
// each; reduce-scatter: nranks pieces each); returns every rank's output back to
// back and the first recorded error ("" if none).
struct GatherScatterResult {
  std::string y, error;
};
GatherScatterResult virtual_gather_scatter(Workspace& ws, Collective c, Algorithm algorithm,
                                           DType dtype, const std::string& x, int64_t count);

// Per-call time (us) of the fused all-reduce + residual + RMSNorm kernel on
// every virtual rank (tokens x hidden per rank), measured as virtual_bench
// measures the all-reduce's.
std::vector<double> virtual_rmsnorm_bench(Workspace& ws, DType dtype, int64_t tokens,
                                          int64_t hidden, int iters, int reps,
                                          RmsNormProtocol protocol = RmsNormProtocol::kAuto,
                                          bool one_launch = false);

// Per-call time (us) of the all-gather or reduce-scatter kernel on every
// virtual rank, measured as virtual_bench measures the all-reduce's.
std::vector<double> virtual_gather_scatter_bench(Workspace& ws, Collective c, Algorithm algorithm,
                                                 DType dtype, int64_t count, int iters, int reps);

// The kernels these tools launch. Workspace::Create loads them with the collective
// kernels: lazily loading a kernel while a collective spins on the device can
// stall until the collective's deadline.
std::vector<const void*> testing_kernel_functions();

}  // namespace jaxll
