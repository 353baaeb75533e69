// Kernel times of virtual_drivers.h: CUDA graphs of many calls on every rank's
// stream (or one launch a call for every rank), replayed under CUDA events.
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/all_reduce.h"
#include "kernels/cuda_call.h"
#include "kernels/exchange.h"
#include "kernels/gather_scatter.h"
#include "kernels/ragged.h"
#include "kernels/rmsnorm.h"
#include "kernels/utility.h"
#include "testing/device_buffers.h"
#include "kernels/group_launch.h"
#include "testing/virtual_drivers.h"

namespace jaxll {
namespace {

// Throws the first error the group's kernels recorded; the views are fresh after it.
void check_no_error(VirtualGroup& g) {
  const std::string error = g.refresh();
  if (!error.empty()) throw std::runtime_error(error);
}

// Captures `iters` rounds of `enqueue(rank, stream)` on every rank's stream into
// one graph, replays it `reps` times and returns microseconds per round. With
// `one_launch` a round is one `enqueue(-1, stream)` on rank 0's stream: every
// rank's call in one launch.
template <class Enqueue>
std::vector<double> time_graph(VirtualGroup& g, int iters, int reps, bool one_launch,
                               Enqueue&& enqueue) {
  const int n = g.size();
  cudaStream_t origin;
  check_cuda(cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking), "creating a stream");
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  std::vector<double> out;
  auto cleanup = [&] {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    cudaStreamDestroy(origin);
  };
  try {
    check_cuda(cudaStreamBeginCapture(origin, cudaStreamCaptureModeThreadLocal), "capturing");
    check_cuda(cudaEventRecord(g.fork_event(), origin), "capturing the fork");
    for (int r = 0; r < n; ++r)
      check_cuda(cudaStreamWaitEvent(g.rank(r).stream, g.fork_event(), 0), "capturing");
    for (int k = 0; k < iters; ++k) {
      if (one_launch) {
        check_status(enqueue(-1, g.rank(0).stream), "capturing a call");
        continue;
      }
      for (int r = 0; r < n; ++r) check_status(enqueue(r, g.rank(r).stream), "capturing a call");
    }
    for (int r = 0; r < n; ++r) {
      check_cuda(cudaEventRecord(g.rank(r).done, g.rank(r).stream), "capturing");
      check_cuda(cudaStreamWaitEvent(origin, g.rank(r).done, 0), "capturing the join");
    }
    check_cuda(cudaStreamEndCapture(origin, &graph), "ending the capture");
    check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiating the graph");
    check_cuda(cudaGraphLaunch(exec, origin), "launching the graph");
    check_cuda(cudaStreamSynchronize(origin), "running the graph");
    const std::string err = g.refresh();
    if (!err.empty()) throw std::runtime_error(err);
    check_cuda(cudaEventCreate(&start), "creating an event");
    check_cuda(cudaEventCreate(&stop), "creating an event");
    for (int rep = 0; rep < reps; ++rep) {
      check_cuda(cudaEventRecord(start, origin), "timing");
      check_cuda(cudaGraphLaunch(exec, origin), "launching the graph");
      check_cuda(cudaEventRecord(stop, origin), "timing");
      check_cuda(cudaEventSynchronize(stop), "timing");
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, start, stop), "timing");
      out.push_back(ms * 1000.0 / iters);
    }
    const std::string err2 = g.refresh();
    if (!err2.empty()) throw std::runtime_error(err2);
  } catch (...) {
    cudaStreamCaptureStatus st;
    if (cudaStreamIsCapturing(origin, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone) {
      cudaGraph_t g;
      cudaStreamEndCapture(origin, &g);
      if (g) cudaGraphDestroy(g);
    }
    cudaGetLastError();
    cleanup();
    throw;
  }
  cleanup();
  return out;
}

}  // namespace

std::vector<double> virtual_bench(VirtualGroup& g, Algorithm algorithm, DType dtype, ReduceOp op,
                                  int64_t count, int iters, int reps, bool one_launch) {
  if (count <= 0 || iters <= 0 || reps <= 0) throw std::runtime_error("count, iters and reps must be positive");
  DeviceGuard guard(g.ordinal());
  check_no_error(g);
  const int n = g.size();
  const size_t bytes = static_cast<size_t>(count) * dtype_bytes(dtype);
  DeviceBuffers bufs;
  std::vector<void*> in(n), out(n);
  for (int r = 0; r < n; ++r) {
    in[r] = bufs.alloc(bytes);
    out[r] = bufs.alloc(bytes);
    // Small nonzero values: repeated sums stay finite for every dtype.
    check_cuda(cudaMemset(in[r], 0x11, bytes), "filling inputs");
  }
  check_cuda(cudaDeviceSynchronize(), "preparing the benchmark");
  const std::vector<RankView> views = g.views();
  std::vector<const void*> ins(in.begin(), in.end());
  return time_graph(g, iters, reps, one_launch, [&](int r, cudaStream_t s) {
    if (r < 0) {
      return launch_all_reduce_group(algorithm, dtype, op, views.data(), n, ins.data(), out.data(),
                                     count, s);
    }
    return launch_all_reduce(algorithm, dtype, op, g.rank(r).view, in[r], out[r], count, s);
  });
}

std::vector<double> virtual_rmsnorm_bench(VirtualGroup& g, DType dtype, int64_t tokens,
                                          int64_t hidden, int iters, int reps,
                                          RmsNormProtocol protocol, bool one_launch) {
  if (tokens <= 0 || hidden <= 0 || iters <= 0 || reps <= 0) {
    throw std::runtime_error("tokens, hidden, iters and reps must be positive");
  }
  if (const char* problem = rmsnorm_unsupported(dtype, hidden, g.rank(0).view)) {
    throw std::runtime_error(std::string("virtual_rmsnorm_bench: unsupported ") + problem);
  }
  DeviceGuard guard(g.ordinal());
  check_no_error(g);
  const int n = g.size();
  const size_t bytes = static_cast<size_t>(tokens * hidden) * dtype_bytes(dtype);
  DeviceBuffers bufs;
  void* w = bufs.alloc(static_cast<size_t>(hidden) * dtype_bytes(dtype));
  check_cuda(cudaMemset(w, 0x11, static_cast<size_t>(hidden) * dtype_bytes(dtype)), "filling the weight");
  std::vector<void*> x(n), res(n), normed(n), nres(n);
  for (int r = 0; r < n; ++r) {
    x[r] = bufs.alloc(bytes);
    res[r] = bufs.alloc(bytes);
    normed[r] = bufs.alloc(bytes);
    nres[r] = bufs.alloc(bytes);
    // small nonzero values (finite sums and norms for every dtype)
    check_cuda(cudaMemset(x[r], 0x11, bytes), "filling inputs");
    check_cuda(cudaMemset(res[r], 0x11, bytes), "filling inputs");
  }
  check_cuda(cudaDeviceSynchronize(), "preparing the benchmark");
  if (plan_all_reduce_rmsnorm(dtype, g.rank(0).view, tokens, hidden, protocol).blocks == 0) {
    throw std::invalid_argument(std::string("all_reduce_rmsnorm: the protocol asked for cannot "
                                            "serve this call: ") + rmsnorm_refusal(protocol));
  }
  const std::vector<RankView> views = g.views();
  std::vector<RmsNormOperands> ops(n);
  for (int r = 0; r < n; ++r) ops[r] = {x[r], res[r], w, normed[r], nres[r]};
  return time_graph(g, iters, reps, one_launch, [&](int r, cudaStream_t s) {
    if (r < 0) {
      return launch_all_reduce_rmsnorm_group(dtype, views.data(), n, ops.data(), tokens, hidden,
                                             1e-6f, protocol, s);
    }
    return launch_all_reduce_rmsnorm(dtype, g.rank(r).view, x[r], res[r], w, normed[r], nres[r],
                                     tokens, hidden, 1e-6f, protocol, s);
  });
}

std::vector<double> virtual_gather_scatter_bench(VirtualGroup& g, Collective c, Algorithm algorithm,
                                                 DType dtype, int64_t count, int64_t segment,
                                                 int iters, int reps) {
  if (count <= 0 || iters <= 0 || reps <= 0) throw std::runtime_error("count, iters and reps must be positive");
  if (!has_gather_scatter_kernel(c, algorithm, dtype)) {
    throw std::runtime_error("virtual_gather_scatter_bench: no kernel for this collective, algorithm and dtype");
  }
  if (segment == 0) segment = count;
  if (!segments_fit(count, segment)) {
    throw std::runtime_error("virtual_gather_scatter_bench: segments of " + std::to_string(segment) +
                             " elements do not fit pieces of " + std::to_string(count));
  }
  DeviceGuard guard(g.ordinal());
  check_no_error(g);
  const int n = g.size();
  const size_t piece = static_cast<size_t>(count) * dtype_bytes(dtype);
  const size_t in_bytes = c == Collective::kAllGather ? piece : piece * n;
  const size_t out_bytes = c == Collective::kAllGather ? piece * n : piece;
  DeviceBuffers bufs;
  std::vector<void*> in(n), out(n);
  for (int r = 0; r < n; ++r) {
    in[r] = bufs.alloc(in_bytes);
    out[r] = bufs.alloc(out_bytes);
    check_cuda(cudaMemset(in[r], 0x11, in_bytes), "filling inputs");
  }
  check_cuda(cudaDeviceSynchronize(), "preparing the benchmark");
  return time_graph(g, iters, reps, false, [&](int r, cudaStream_t s) {
    return launch_gather_scatter(c, algorithm, dtype, g.rank(r).view, in[r], out[r], count, segment,
                                 s);
  });
}

std::vector<double> virtual_exchange_bench(VirtualGroup& g, Collective c, Algorithm algorithm,
                                           DType dtype, int64_t count,
                                           const std::vector<int64_t>& dests, int iters,
                                           int reps) {
  if (count <= 0 || iters <= 0 || reps <= 0) throw std::runtime_error("count, iters and reps must be positive");
  if (!has_exchange_kernel(c, algorithm, dtype)) {
    throw std::runtime_error("virtual_exchange_bench: no kernel for this collective, algorithm and dtype");
  }
  const int n = g.size();
  const bool permute = c == Collective::kPermute;
  if (permute && static_cast<int>(dests.size()) != n) {
    throw std::runtime_error("virtual_exchange_bench: dests must name one destination per rank");
  }
  DeviceGuard guard(g.ordinal());
  check_no_error(g);
  const size_t bytes = static_cast<size_t>(count) * dtype_bytes(dtype) * (permute ? 1 : n);
  DeviceBuffers bufs;
  std::vector<void*> in(n), out(n);
  for (int r = 0; r < n; ++r) {
    in[r] = bufs.alloc(bytes);
    out[r] = bufs.alloc(bytes);
    check_cuda(cudaMemset(in[r], 0x11, bytes), "filling inputs");
  }
  check_cuda(cudaDeviceSynchronize(), "preparing the benchmark");
  const uint32_t tag = permute ? permutation_tag(dests.data(), n) : 0;
  return time_graph(g, iters, reps, false, [&](int r, cudaStream_t s) {
    if (!permute) {
      return launch_all_to_all(algorithm, dtype, g.rank(r).view, in[r], out[r], count, count,
                               count, s);
    }
    int src = -1;
    for (int k = 0; k < n; ++k) {
      if (dests[k] == r) src = k;
    }
    return launch_ppermute(algorithm, dtype, g.rank(r).view, in[r], out[r], count,
                           static_cast<int>(dests[r]), src, tag, s);
  });
}

std::vector<double> virtual_ragged_bench(VirtualGroup& g, Algorithm algorithm, DType dtype,
                                         const RaggedCase& c, int iters, int reps) {
  if (iters <= 0 || reps <= 0) throw std::runtime_error("iters and reps must be positive");
  if (!has_ragged_kernel(algorithm, dtype)) {
    throw std::runtime_error("virtual_ragged_bench: no kernel for this algorithm and dtype");
  }
  const int n = g.size();
  const size_t k = c.sizes.size() / (4 * static_cast<size_t>(n));
  if (c.row_elems <= 0 || k == 0 || c.sizes.size() != 4 * k * n || k % n != 0) {
    throw std::runtime_error("virtual_ragged_bench: sizes must hold every rank's four arrays");
  }
  DeviceGuard guard(g.ordinal());
  check_no_error(g);
  const size_t row = static_cast<size_t>(c.row_elems) * dtype_bytes(dtype);
  DeviceBuffers bufs;
  std::vector<void*> in(n), out(n);
  auto* ds = static_cast<int32_t*>(bufs.alloc(c.sizes.size() * sizeof(int32_t)));
  check_cuda(cudaMemcpy(ds, c.sizes.data(), c.sizes.size() * sizeof(int32_t),
                        cudaMemcpyHostToDevice), "copying the sizes");
  for (int r = 0; r < n; ++r) {
    in[r] = bufs.alloc(row * c.operand_rows + 8);
    out[r] = bufs.alloc(row * c.output_rows + 8);
    check_cuda(cudaMemset(in[r], 0x11, row * c.operand_rows), "filling inputs");
  }
  check_cuda(cudaDeviceSynchronize(), "preparing the benchmark");
  return time_graph(g, iters, reps, false, [&](int r, cudaStream_t s) {
    const int32_t* z = ds + 4 * k * r;
    const RaggedCall call{in[r], out[r], c.operand_rows, c.output_rows, c.row_elems,
                          z, z + k, z + 2 * k, z + 3 * k, static_cast<int>(k / n)};
    return launch_ragged_all_to_all(algorithm, dtype, g.rank(r).view, call, s);
  });
}

std::vector<double> virtual_floor(VirtualGroup& g, int iters, int reps, bool one_launch) {
  DeviceGuard guard(g.ordinal());
  check_no_error(g);
  return time_graph(g, iters, reps, one_launch, [&](int, cudaStream_t s) { return launch_empty(s); });
}

}  // namespace jaxll
