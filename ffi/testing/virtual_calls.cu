// Fault injection and single calls of virtual_drivers.h: every rank its own
// all-reduce (ranks that disagree, skip or are late), the fused call with an
// absent or a late rank, one all-gather or reduce-scatter, one ppermute or
// all-to-all.
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/all_reduce.h"
#include "kernels/cuda_call.h"
#include "kernels/exchange.h"
#include "kernels/gather_scatter.h"
#include "kernels/ragged.h"
#include "kernels/rmsnorm.h"
#include "testing/delay.h"
#include "testing/device_buffers.h"
#include "testing/virtual_drivers.h"

namespace jaxll {
namespace {

// Counts elements of `buf` (elem_bytes wide) whose bits are all ones.
__global__ void count_poison_kernel(const unsigned char* buf, int64_t count, int elem_bytes,
                                    unsigned long long* out) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    bool all = true;
    for (int b = 0; b < elem_bytes; ++b) all = all && buf[i * elem_bytes + b] == 0xFF;
    local += all ? 1 : 0;
  }
  if (local) atomicAdd(out, local);
}

// A fused launch's status as an exception; a protocol asked for where it
// cannot serve is the caller's (rmsnorm_refusal).
void check_rmsnorm(const Status& s, RmsNormProtocol protocol) {
  if (s.code() == StatusCode::kRefused) {
    throw std::invalid_argument(std::string("all_reduce_rmsnorm: the protocol asked for cannot "
                                            "serve this call: ") + rmsnorm_refusal(protocol));
  }
  check_status(s, "launching an all_reduce_rmsnorm");
}

}  // namespace

std::vector<int64_t> virtual_calls(VirtualGroup& g, const std::vector<RankCall>& calls) {
  const int n = g.size();
  if (static_cast<int>(calls.size()) != n) {
    throw std::runtime_error("virtual_calls needs one call per rank (" + std::to_string(n) + ")");
  }
  for (const RankCall& c : calls) {
    if (c.count <= 0) throw std::runtime_error("element counts must be positive");
    if (!has_kernel(c.algorithm, c.dtype, c.op)) {
      throw std::runtime_error("virtual_calls: no kernel for an algorithm/dtype/op combination");
    }
  }
  DeviceGuard guard(g.ordinal());
  g.refresh();
  DeviceBuffers bufs;
  std::vector<void*> in(n), out(n);
  auto* counts = static_cast<unsigned long long*>(bufs.alloc(n * sizeof(unsigned long long)));
  check_cuda(cudaMemset(counts, 0, n * sizeof(unsigned long long)), "clearing counters");
  for (int r = 0; r < n; ++r) {
    const size_t bytes = static_cast<size_t>(calls[r].count) * dtype_bytes(calls[r].dtype);
    in[r] = bufs.alloc(bytes);
    out[r] = bufs.alloc(bytes);
    check_cuda(cudaMemset(in[r], 0x11, bytes), "filling inputs");
    check_cuda(cudaMemset(out[r], 0, bytes), "clearing outputs");
  }
  check_cuda(cudaDeviceSynchronize(), "preparing the calls");
  // The ranks on time are queued first and given a moment to be resident (spinning on
  // the late ranks); only then are the late ranks' delay kernels queued, so those have
  // to find room on an SM while the other calls occupy the GPU, as a lagging rank's
  // kernels do in a real run.
  auto launch = [&](int r) {
    const RankCall& c = calls[r];
    for (int k = 0; c.delay_us > 0 && k < c.delay_kernels; ++k)
      launch_delay(g.rank(r).stream, static_cast<uint64_t>(c.delay_us) * 1000);
    check_status(launch_all_reduce(c.algorithm, c.dtype, c.op, g.rank(r).view, in[r], out[r],
                                   c.count, g.rank(r).stream),
                 "launching an all-reduce");
  };
  bool any_late = false;
  for (int r = 0; r < n; ++r) {
    if (calls[r].skip) continue;
    if (calls[r].delay_us > 0) any_late = true;
    else launch(r);
  }
  if (any_late) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  for (int r = 0; r < n; ++r) {
    if (!calls[r].skip && calls[r].delay_us > 0) launch(r);
  }
  for (int r = 0; r < n; ++r) {
    count_poison_kernel<<<64, 256, 0, g.rank(r).stream>>>(
        static_cast<const unsigned char*>(out[r]), calls[r].count, dtype_bytes(calls[r].dtype),
        counts + r);
  }
  check_cuda(cudaGetLastError(), "launching the checks");
  g.sync();
  std::vector<unsigned long long> host(n);
  check_cuda(cudaMemcpy(host.data(), counts, n * sizeof(unsigned long long), cudaMemcpyDeviceToHost),
             "reading the counters");
  return std::vector<int64_t>(host.begin(), host.end());
}

RmsNormResult virtual_rmsnorm(VirtualGroup& g, DType dtype, const std::string& x,
                              const std::string& residual, const std::string& weight,
                              int64_t tokens, int64_t hidden, float eps, int absent,
                              int late, int64_t delay_us, RmsNormProtocol protocol) {
  const int n = g.size();
  const size_t row_bytes = static_cast<size_t>(hidden) * dtype_bytes(dtype);
  const size_t block = row_bytes * static_cast<size_t>(tokens);
  if (tokens <= 0 || hidden <= 0 || x.size() != block * n || residual.size() != block ||
      weight.size() != row_bytes) {
    throw std::runtime_error("virtual_rmsnorm: x must hold (ranks, tokens, hidden), residual "
                             "(tokens, hidden) and weight (hidden,) elements");
  }
  DeviceGuard guard(g.ordinal());
  g.refresh();  // (the views: calls on a workspace in error poison, and say so at the end)
  if (const char* problem = rmsnorm_unsupported(dtype, hidden, g.rank(0).view)) {
    throw std::runtime_error(std::string("virtual_rmsnorm: unsupported ") + problem);
  }
  DeviceBuffers bufs;
  char* dx = static_cast<char*>(bufs.alloc(block * n));
  char* dres = static_cast<char*>(bufs.alloc(block));
  char* dw = static_cast<char*>(bufs.alloc(row_bytes));
  char* dnormed = static_cast<char*>(bufs.alloc(block * n));
  char* dnew = static_cast<char*>(bufs.alloc(block * n));
  check_cuda(cudaMemcpy(dx, x.data(), x.size(), cudaMemcpyHostToDevice), "copying x");
  check_cuda(cudaMemcpy(dres, residual.data(), block, cudaMemcpyHostToDevice), "copying residual");
  check_cuda(cudaMemcpy(dw, weight.data(), row_bytes, cudaMemcpyHostToDevice), "copying weight");
  check_cuda(cudaMemset(dnormed, 0, block * n), "clearing outputs");
  check_cuda(cudaMemset(dnew, 0, block * n), "clearing outputs");
  check_cuda(cudaDeviceSynchronize(), "preparing the calls");
  auto launch = [&](int r) {
    check_rmsnorm(launch_all_reduce_rmsnorm(dtype, g.rank(r).view, dx + r * block, dres, dw,
                                            dnormed + r * block, dnew + r * block, tokens, hidden,
                                            eps, protocol, g.rank(r).stream),
                  protocol);
  };
  for (int r = 0; r < n; ++r) {
    if (r != absent && r != late) launch(r);
  }
  if (late >= 0 && late < n && late != absent) {
    // the late rank's delay kernel is queued once the others' calls spin on the
    // GPU, as virtual_calls does: it must find room among their blocks
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    launch_delay(g.rank(late).stream, static_cast<uint64_t>(delay_us) * 1000);
    launch(late);
  }
  g.sync();
  RmsNormResult out;
  out.error = g.refresh();
  if (!out.error.empty() && absent < 0) throw std::runtime_error(out.error);
  out.normed.assign(block * n, '\0');
  out.new_residual.assign(block * n, '\0');
  check_cuda(cudaMemcpy(out.normed.data(), dnormed, block * n, cudaMemcpyDeviceToHost), "reading normed");
  check_cuda(cudaMemcpy(out.new_residual.data(), dnew, block * n, cudaMemcpyDeviceToHost),
             "reading new_residual");
  return out;
}

GatherScatterResult virtual_gather_scatter(VirtualGroup& g, Collective c, Algorithm algorithm,
                                           DType dtype, const std::string& x, int64_t count,
                                           int64_t segment) {
  if (c != Collective::kAllGather && c != Collective::kReduceScatter) {
    throw std::runtime_error("virtual_gather_scatter: the collective must be all_gather or psum_scatter");
  }
  if (!has_gather_scatter_kernel(c, algorithm, dtype)) {
    throw std::runtime_error("virtual_gather_scatter: no kernel for this algorithm and dtype");
  }
  const int n = g.size();
  const size_t piece = static_cast<size_t>(count) * dtype_bytes(dtype);
  const bool gather = c == Collective::kAllGather;
  const size_t in_bytes = gather ? piece : piece * n;    // per rank
  const size_t out_bytes = gather ? piece * n : piece;   // per rank
  if (count <= 0 || x.size() != in_bytes * n) {
    throw std::runtime_error("virtual_gather_scatter: x must hold every rank's input back to back");
  }
  if (segment == 0) segment = count;
  if (!segments_fit(count, segment)) {
    throw std::runtime_error("virtual_gather_scatter: segments of " + std::to_string(segment) +
                             " elements do not fit pieces of " + std::to_string(count));
  }
  DeviceGuard guard(g.ordinal());
  g.refresh();  // (the views: calls on a workspace in error poison, and say so at the end)
  DeviceBuffers bufs;
  char* dx = static_cast<char*>(bufs.alloc(in_bytes * n));
  char* dy = static_cast<char*>(bufs.alloc(out_bytes * n));
  check_cuda(cudaMemcpy(dx, x.data(), x.size(), cudaMemcpyHostToDevice), "copying x");
  check_cuda(cudaMemset(dy, 0, out_bytes * n), "clearing outputs");
  check_cuda(cudaDeviceSynchronize(), "preparing the calls");
  for (int r = 0; r < n; ++r) {
    check_status(launch_gather_scatter(c, algorithm, dtype, g.rank(r).view, dx + r * in_bytes,
                                       dy + r * out_bytes, count, segment, g.rank(r).stream),
                 "launching a gather/scatter");
  }
  g.sync();
  GatherScatterResult out;
  out.error = g.refresh();
  out.y.assign(out_bytes * n, '\0');
  check_cuda(cudaMemcpy(out.y.data(), dy, out_bytes * n, cudaMemcpyDeviceToHost), "reading outputs");
  return out;
}

namespace {

// Runs `launch(r, in, out)` for every rank but `absent` on inputs `x` (every
// rank's `in_bytes` back to back) and returns the outputs (`out_bytes` each).
template <class Launch>
GatherScatterResult run_each_rank(VirtualGroup& g, const std::string& x, size_t in_bytes,
                                  size_t out_bytes, int absent, Launch&& launch) {
  const int n = g.size();
  if (x.size() != in_bytes * n) {
    throw std::runtime_error("x must hold every rank's input back to back");
  }
  DeviceGuard guard(g.ordinal());
  g.refresh();
  DeviceBuffers bufs;
  char* dx = static_cast<char*>(bufs.alloc(in_bytes * n));
  char* dy = static_cast<char*>(bufs.alloc(out_bytes * n));
  check_cuda(cudaMemcpy(dx, x.data(), x.size(), cudaMemcpyHostToDevice), "copying x");
  check_cuda(cudaMemset(dy, 0x5A, out_bytes * n), "filling outputs");
  check_cuda(cudaDeviceSynchronize(), "preparing the calls");
  for (int r = 0; r < n; ++r) {
    if (r != absent) check_status(launch(r, dx + r * in_bytes, dy + r * out_bytes), "launching");
  }
  g.sync();
  GatherScatterResult out;
  out.error = g.refresh();
  if (!out.error.empty() && absent < 0) throw std::runtime_error(out.error);
  out.y.assign(out_bytes * n, '\0');
  check_cuda(cudaMemcpy(out.y.data(), dy, out_bytes * n, cudaMemcpyDeviceToHost), "reading outputs");
  return out;
}

}  // namespace

GatherScatterResult virtual_ppermute(VirtualGroup& g, Algorithm algorithm, DType dtype,
                                     const std::string& x, int64_t count,
                                     const std::vector<int64_t>& dests, int absent) {
  if (!has_exchange_kernel(Collective::kPermute, algorithm, dtype)) {
    throw std::runtime_error("virtual_ppermute: no kernel for this algorithm and dtype");
  }
  const int n = g.size();
  if (count <= 0 || static_cast<int>(dests.size()) != n) {
    throw std::runtime_error("virtual_ppermute: count must be positive, dests one per rank");
  }
  const size_t bytes = static_cast<size_t>(count) * dtype_bytes(dtype);
  const uint32_t tag = permutation_tag(dests.data(), n);
  return run_each_rank(g, x, bytes, bytes, absent, [&](int r, const void* in, void* out) {
    int src = -1;
    for (int s = 0; s < n; ++s) {
      if (dests[s] == r) src = s;
    }
    return launch_ppermute(algorithm, dtype, g.rank(r).view, in, out, count,
                           static_cast<int>(dests[r]), src, tag, g.rank(r).stream);
  });
}

GatherScatterResult virtual_all_to_all(VirtualGroup& g, Algorithm algorithm, DType dtype,
                                       const std::string& x, int64_t count, int64_t in_segment,
                                       int64_t out_segment, int absent) {
  if (!has_exchange_kernel(Collective::kAllToAll, algorithm, dtype)) {
    throw std::runtime_error("virtual_all_to_all: no kernel for this algorithm and dtype");
  }
  if (in_segment == 0) in_segment = count;
  if (out_segment == 0) out_segment = count;
  if (count <= 0 || !segments_fit(count, in_segment) || !segments_fit(count, out_segment)) {
    throw std::runtime_error("virtual_all_to_all: segments of " + std::to_string(in_segment) +
                             " and " + std::to_string(out_segment) +
                             " elements do not fit pieces of " + std::to_string(count));
  }
  const size_t bytes = static_cast<size_t>(count) * dtype_bytes(dtype) * g.size();
  return run_each_rank(g, x, bytes, bytes, absent, [&](int r, const void* in, void* out) {
    return launch_all_to_all(algorithm, dtype, g.rank(r).view, in, out, count, in_segment,
                             out_segment, g.rank(r).stream);
  });
}

GatherScatterResult virtual_ragged_all_to_all(VirtualGroup& g, Algorithm algorithm, DType dtype,
                                              const RaggedCase& c, int absent) {
  if (!has_ragged_kernel(algorithm, dtype)) {
    throw std::runtime_error("virtual_ragged_all_to_all: no kernel for this algorithm and dtype");
  }
  const int n = g.size();
  const size_t row = static_cast<size_t>(c.row_elems) * dtype_bytes(dtype);
  const size_t in_bytes = row * c.operand_rows, out_bytes = row * c.output_rows;
  const size_t k = c.sizes.size() / (4 * static_cast<size_t>(n));
  if (c.row_elems <= 0 || c.operand.size() != in_bytes * n || c.output.size() != out_bytes * n ||
      k == 0 || c.sizes.size() != 4 * k * n || k % n != 0) {
    throw std::runtime_error("virtual_ragged_all_to_all: operand, output and sizes must hold every "
                             "rank's, the sizes four arrays of a multiple of the group size each");
  }
  DeviceGuard guard(g.ordinal());
  g.refresh();
  DeviceBuffers bufs;
  char* dx = static_cast<char*>(bufs.alloc(in_bytes * n + 8));
  char* dy = static_cast<char*>(bufs.alloc(out_bytes * n + 8));
  auto* ds = static_cast<int32_t*>(bufs.alloc(c.sizes.size() * sizeof(int32_t)));
  check_cuda(cudaMemcpy(dx, c.operand.data(), c.operand.size(), cudaMemcpyHostToDevice), "copying");
  check_cuda(cudaMemcpy(dy, c.output.data(), c.output.size(), cudaMemcpyHostToDevice), "copying");
  check_cuda(cudaMemcpy(ds, c.sizes.data(), c.sizes.size() * sizeof(int32_t),
                        cudaMemcpyHostToDevice), "copying");
  check_cuda(cudaDeviceSynchronize(), "preparing the calls");
  for (int r = 0; r < n; ++r) {
    if (r == absent) continue;
    const int32_t* s = ds + 4 * k * r;
    const RaggedCall call{dx + in_bytes * r, dy + out_bytes * r, c.operand_rows, c.output_rows,
                          c.row_elems, s, s + k, s + 2 * k, s + 3 * k, static_cast<int>(k / n)};
    check_status(launch_ragged_all_to_all(algorithm, dtype, g.rank(r).view, call, g.rank(r).stream),
                 "launching a ragged all-to-all");
  }
  g.sync();
  GatherScatterResult out;
  out.error = g.refresh();
  if (!out.error.empty() && absent < 0) throw std::runtime_error(out.error);
  out.y.assign(out_bytes * n, '\0');
  check_cuda(cudaMemcpy(out.y.data(), dy, out_bytes * n, cudaMemcpyDeviceToHost), "reading outputs");
  return out;
}

std::vector<const void*> call_kernel_functions() {
  return {reinterpret_cast<const void*>(&count_poison_kernel), delay_kernel_function()};
}

}  // namespace jaxll
