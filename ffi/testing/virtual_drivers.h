// What the testing tools run on a virtual group (N ranks of one workspace on
// one GPU, a stream each; Python: jaxll.tools.testing).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/rmsnorm.h"
#include "kernels/types.h"
#include "testing/virtual_group.h"

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
};

// Runs counts.size() consecutive all-reduces on every rank of `g` (call i uses
// algorithms[i % size]), each rank on its own stream with no synchronisation
// between ranks other than the all-reduce itself (random delays skew the ranks
// further). Inputs are a deterministic hash of (seed, call, rank, index);
// every output element, and guard elements around it, are checked on the
// device: bit for bit against the same reduction computed in rank order, or,
// for LL128-atomic (not reproducible), against the float64 sum within
// n * eps * sum|x| and bitwise equal across ranks. (virtual_stress.cu)
StressResult virtual_stress(VirtualGroup& g, const std::vector<Algorithm>& algorithms, DType dtype,
                            ReduceOp op, const std::vector<int64_t>& counts, uint64_t seed,
                            int max_delay_us);

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

// Fault injection: one all-reduce per rank of `g`, each rank with its own
// arguments (ranks may disagree, skip or be late), inputs filled with 0x11
// bytes, outputs zeroed before. Waits for every rank, then returns for each
// rank the number of its output elements that hold the poison pattern.
// (virtual_calls.cu)
std::vector<int64_t> virtual_calls(VirtualGroup& g, const std::vector<RankCall>& calls);

// The fused all-reduce + residual + RMSNorm on every rank of `g`: x holds every
// rank's (tokens, hidden) block back to back (rank-major), residual and weight
// are shared; returns (normed, new_residual) of every rank, rank-major, as raw
// bytes, and the first recorded error. Rank `absent` (if >= 0) makes no call:
// the others give up, and their outputs and the error come back; with every
// rank present a recorded error throws instead. Rank `late` (if >= 0) queues
// its call 2 ms after the others, behind a one-thread kernel of `delay_us`.
// (virtual_calls.cu)
struct RmsNormResult {
  std::string normed, new_residual, error;
};
RmsNormResult virtual_rmsnorm(VirtualGroup& g, DType dtype, const std::string& x,
                              const std::string& residual, const std::string& weight,
                              int64_t tokens, int64_t hidden, float eps, int absent, int late,
                              int64_t delay_us, RmsNormProtocol protocol);

// One all-gather or reduce-scatter (pieces of `count` elements) on every rank
// of `g`: x holds every rank's input back to back (all-gather: one piece each;
// reduce-scatter: nranks pieces each); returns every rank's output back to
// back and the first recorded error ("" if none). Pieces are cut into segments
// of `segment` elements (gather_scatter.h; 0: one segment). (virtual_calls.cu)
struct GatherScatterResult {
  std::string y, error;
};
GatherScatterResult virtual_gather_scatter(VirtualGroup& g, Collective c, Algorithm algorithm,
                                           DType dtype, const std::string& x, int64_t count,
                                           int64_t segment);

// One ppermute (`count` elements a rank; dests[r]: rank r's destination, -1:
// none) or one all-to-all (pieces of `count` elements, the input's in segments
// of `in_segment`, the output's of `out_segment`; 0: one segment) on every rank
// of `g`: x holds every rank's input back to back; returns every rank's output
// back to back and the first recorded error ("" if none). Rank `absent` (>= 0)
// makes no call: the others give up, and their outputs and the error come
// back; with every rank present a recorded error throws. (virtual_calls.cu)
GatherScatterResult virtual_ppermute(VirtualGroup& g, Algorithm algorithm, DType dtype,
                                     const std::string& x, int64_t count,
                                     const std::vector<int64_t>& dests, int absent);
GatherScatterResult virtual_all_to_all(VirtualGroup& g, Algorithm algorithm, DType dtype,
                                       const std::string& x, int64_t count, int64_t in_segment,
                                       int64_t out_segment, int absent);

// A ragged all-to-all's arguments on every rank: `operand` and `output` hold
// every rank's (operand_rows or output_rows) x row_elems elements back to
// back; `sizes` every rank's four int32 arrays of n x slices entries, in
// ragged_all_to_all's order (input_offsets, send_sizes, output_offsets,
// recv_sizes), rank after rank.
struct RaggedCase {
  std::string operand, output;
  int64_t operand_rows = 0, output_rows = 0, row_elems = 0;
  std::vector<int32_t> sizes;
};
// One call on every rank but `absent`: every rank's output after it, and the
// first recorded error, as virtual_ppermute. (virtual_calls.cu)
GatherScatterResult virtual_ragged_all_to_all(VirtualGroup& g, Algorithm algorithm, DType dtype,
                                              const RaggedCase& c, int absent);

// Kernel time of one call, in microseconds, once per repetition: a CUDA graph
// holds `iters` consecutive calls on every rank's stream (no joins between
// calls) and is replayed `reps` times under CUDA events. With `one_launch` each
// call is every rank's in one launch (group_launch.h) on one stream.
// (virtual_timing.cu)
std::vector<double> virtual_bench(VirtualGroup& g, Algorithm algorithm, DType dtype, ReduceOp op,
                                  int64_t count, int iters, int reps, bool one_launch);
std::vector<double> virtual_rmsnorm_bench(VirtualGroup& g, DType dtype, int64_t tokens,
                                          int64_t hidden, int iters, int reps,
                                          RmsNormProtocol protocol, bool one_launch);
std::vector<double> virtual_gather_scatter_bench(VirtualGroup& g, Collective c, Algorithm algorithm,
                                                 DType dtype, int64_t count, int64_t segment,
                                                 int iters, int reps);
// ppermute (dests as for virtual_ppermute) or all-to-all (one segment per piece)
// of `count` elements a rank (a piece), timed as virtual_bench times.
std::vector<double> virtual_exchange_bench(VirtualGroup& g, Collective c, Algorithm algorithm,
                                           DType dtype, int64_t count,
                                           const std::vector<int64_t>& dests, int iters, int reps);
// A ragged all-to-all of `c` (its data need not be given), timed as
// virtual_bench times.
std::vector<double> virtual_ragged_bench(VirtualGroup& g, Algorithm algorithm, DType dtype,
                                         const RaggedCase& c, int iters, int reps);
// The same graph with an empty kernel per rank and call (`one_launch`: one
// empty kernel per call): the graph-node floor.
std::vector<double> virtual_floor(VirtualGroup& g, int iters, int reps, bool one_launch);

// Sets every block's epoch of every rank to `epoch` (devices idle first), as if
// that many rounds had run, every LL16 slot carrying that epoch's flag: lets
// tests cross the 32-bit flag wrap and the LL16 refresh (every 2^30 epochs)
// without 2^30 calls. (epochs.cc)
void set_epochs(VirtualGroup& g, uint64_t epoch);

// The kernels these drivers launch besides the library's (loaded with every
// workspace, as the library's are).
std::vector<const void*> stress_kernel_functions();
std::vector<const void*> call_kernel_functions();

}  // namespace jaxll
