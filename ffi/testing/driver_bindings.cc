// The bindings of the drivers (virtual_drivers.h) and the speed-of-light probes.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "testing/sol_probe.h"
#include "testing/testing_bindings.h"
#include "testing/virtual_drivers.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace jaxll {
namespace {

VirtualGroup& group_of(int64_t id) {
  VirtualGroup* g = find_group(id);
  if (g == nullptr) {
    throw std::runtime_error("jaxll: workspace " + std::to_string(id) +
                             " is not attached to the testing tools (attach it first)");
  }
  return *g;
}

RmsNormProtocol protocol_of(int code) {
  if (rmsnorm_protocol_name(code) == nullptr) {
    throw std::invalid_argument("all_reduce_rmsnorm: unknown protocol code " + std::to_string(code));
  }
  return static_cast<RmsNormProtocol>(code);
}

std::string as_string(const nb::bytes& b) { return std::string(b.c_str(), b.size()); }
nb::bytes as_bytes(const std::string& s) { return nb::bytes(s.data(), s.size()); }

nb::dict stress_dict(const StressResult& r) {
  nb::dict d;
  d["calls"] = r.calls;
  d["mismatches"] = r.mismatches;
  d["first_call"] = r.first_call;
  d["first_rank"] = r.first_rank;
  d["first_index"] = r.first_index;
  d["got_bits"] = r.got_bits;
  d["want_bits"] = r.want_bits;
  d["error"] = r.error;
  return d;
}

using CallSpec = std::tuple<int, int, int, int64_t, bool, int64_t, int>;

std::vector<RankCall> rank_calls(const std::vector<CallSpec>& spec) {
  std::vector<RankCall> calls;
  for (const auto& [algorithm, dtype, op, count, skip, delay_us, delay_kernels] : spec) {
    RankCall rc;
    rc.algorithm = static_cast<Algorithm>(algorithm);
    rc.dtype = static_cast<DType>(dtype);
    rc.op = static_cast<ReduceOp>(op);
    rc.count = count;
    rc.skip = skip;
    rc.delay_us = delay_us;
    rc.delay_kernels = delay_kernels;
    calls.push_back(rc);
  }
  return calls;
}

void bind_checks(nb::module_& m) {
  m.def("virtual_stress", [](int64_t id, const std::vector<int>& algorithms, int dtype, int op,
                             const std::vector<int64_t>& counts, uint64_t seed, int max_delay_us) {
    VirtualGroup& g = group_of(id);
    std::vector<Algorithm> algs;
    for (int a : algorithms) algs.push_back(static_cast<Algorithm>(a));
    StressResult r;
    {
      nb::gil_scoped_release release;
      r = virtual_stress(g, algs, static_cast<DType>(dtype), static_cast<ReduceOp>(op), counts,
                         seed, max_delay_us);
    }
    return stress_dict(r);
  }, "id"_a, "algorithms"_a, "dtype"_a, "op"_a, "counts"_a, "seed"_a, "max_delay_us"_a);
  m.def("virtual_calls", [](int64_t id, const std::vector<CallSpec>& spec) {
    VirtualGroup& g = group_of(id);
    const std::vector<RankCall> calls = rank_calls(spec);
    nb::gil_scoped_release release;
    return virtual_calls(g, calls);
  }, "id"_a, "calls"_a,
        "One all-reduce per virtual rank, each with its own (algorithm, dtype, op, count, "
        "skip, delay_us, delay_kernels); returns each rank's count of poisoned output elements.");
  m.def("virtual_rmsnorm", [](int64_t id, int dtype, nb::bytes x, nb::bytes residual,
                              nb::bytes weight, int64_t tokens, int64_t hidden, float eps,
                              int absent, int late, int64_t delay_us, int protocol) {
    VirtualGroup& g = group_of(id);
    const std::string xs = as_string(x), rs = as_string(residual), ws = as_string(weight);
    RmsNormResult out;
    {
      nb::gil_scoped_release release;
      out = virtual_rmsnorm(g, static_cast<DType>(dtype), xs, rs, ws, tokens, hidden, eps, absent,
                            late, delay_us, protocol_of(protocol));
    }
    return nb::make_tuple(as_bytes(out.normed), as_bytes(out.new_residual), out.error);
  }, "id"_a, "dtype"_a, "x"_a, "residual"_a, "weight"_a, "tokens"_a, "hidden"_a, "eps"_a,
        "absent"_a = -1, "late"_a = -1, "delay_us"_a = 0, "protocol"_a = 1,
        "The fused all-reduce + residual + RMSNorm on every virtual rank (raw bytes in and out) "
        "and the first recorded error; rank `absent` (>= 0) makes no call; rank `late` (>= 0) "
        "queues its call after the others, behind a delay kernel of `delay_us`.");
  m.def("virtual_gather_scatter", [](int64_t id, int collective, int algorithm, int dtype,
                                     nb::bytes x, int64_t count, int64_t segment) {
    VirtualGroup& g = group_of(id);
    const std::string xs = as_string(x);
    GatherScatterResult out;
    {
      nb::gil_scoped_release release;
      out = virtual_gather_scatter(g, static_cast<Collective>(collective),
                                   static_cast<Algorithm>(algorithm), static_cast<DType>(dtype),
                                   xs, count, segment);
    }
    return nb::make_tuple(as_bytes(out.y), out.error);
  }, "id"_a, "collective"_a, "algorithm"_a, "dtype"_a, "x"_a, "count"_a, "segment"_a = 0);
  m.def("virtual_ppermute", [](int64_t id, int algorithm, int dtype, nb::bytes x, int64_t count,
                               std::vector<int64_t> dests, int absent) {
    VirtualGroup& g = group_of(id);
    const std::string xs = as_string(x);
    GatherScatterResult out;
    {
      nb::gil_scoped_release release;
      out = virtual_ppermute(g, static_cast<Algorithm>(algorithm), static_cast<DType>(dtype), xs,
                             count, dests, absent);
    }
    return nb::make_tuple(as_bytes(out.y), out.error);
  }, "id"_a, "algorithm"_a, "dtype"_a, "x"_a, "count"_a, "dests"_a, "absent"_a = -1);
  m.def("virtual_all_to_all", [](int64_t id, int algorithm, int dtype, nb::bytes x, int64_t count,
                                 int64_t in_segment, int64_t out_segment, int absent) {
    VirtualGroup& g = group_of(id);
    const std::string xs = as_string(x);
    GatherScatterResult out;
    {
      nb::gil_scoped_release release;
      out = virtual_all_to_all(g, static_cast<Algorithm>(algorithm), static_cast<DType>(dtype),
                               xs, count, in_segment, out_segment, absent);
    }
    return nb::make_tuple(as_bytes(out.y), out.error);
  }, "id"_a, "algorithm"_a, "dtype"_a, "x"_a, "count"_a, "in_segment"_a = 0,
        "out_segment"_a = 0, "absent"_a = -1);
  m.def("virtual_ragged_all_to_all", [](int64_t id, int algorithm, int dtype, nb::bytes operand,
                                        nb::bytes output, int64_t operand_rows,
                                        int64_t output_rows, int64_t row_elems,
                                        std::vector<int32_t> sizes, int absent) {
    VirtualGroup& g = group_of(id);
    RaggedCase c{as_string(operand), as_string(output), operand_rows, output_rows, row_elems,
                 std::move(sizes)};
    GatherScatterResult out;
    {
      nb::gil_scoped_release release;
      out = virtual_ragged_all_to_all(g, static_cast<Algorithm>(algorithm),
                                      static_cast<DType>(dtype), c, absent);
    }
    return nb::make_tuple(as_bytes(out.y), out.error);
  }, "id"_a, "algorithm"_a, "dtype"_a, "operand"_a, "output"_a, "operand_rows"_a,
        "output_rows"_a, "row_elems"_a, "sizes"_a, "absent"_a = -1);
  m.def("set_epochs", [](int64_t id, uint64_t epoch) {
    VirtualGroup& g = group_of(id);
    nb::gil_scoped_release release;
    set_epochs(g, epoch);
  }, "id"_a, "epoch"_a, "Sets every block's epoch, as if that many rounds had run (devices idle).");
}

void bind_timing(nb::module_& m) {
  m.def("virtual_bench", [](int64_t id, int algorithm, int dtype, int op, int64_t count, int iters,
                            int reps, bool one_launch) {
    VirtualGroup& g = group_of(id);
    nb::gil_scoped_release release;
    return virtual_bench(g, static_cast<Algorithm>(algorithm), static_cast<DType>(dtype),
                         static_cast<ReduceOp>(op), count, iters, reps, one_launch);
  }, "id"_a, "algorithm"_a, "dtype"_a, "op"_a, "count"_a, "iters"_a, "reps"_a,
        "one_launch"_a = false);
  m.def("virtual_rmsnorm_bench", [](int64_t id, int dtype, int64_t tokens, int64_t hidden,
                                    int iters, int reps, int protocol, bool one_launch) {
    VirtualGroup& g = group_of(id);
    const RmsNormProtocol p = protocol_of(protocol);
    nb::gil_scoped_release release;
    return virtual_rmsnorm_bench(g, static_cast<DType>(dtype), tokens, hidden, iters, reps, p,
                                 one_launch);
  }, "id"_a, "dtype"_a, "tokens"_a, "hidden"_a, "iters"_a, "reps"_a, "protocol"_a = 1,
        "one_launch"_a = false);
  m.def("virtual_gather_scatter_bench", [](int64_t id, int collective, int algorithm, int dtype,
                                           int64_t count, int iters, int reps, int64_t segment) {
    VirtualGroup& g = group_of(id);
    nb::gil_scoped_release release;
    return virtual_gather_scatter_bench(g, static_cast<Collective>(collective),
                                        static_cast<Algorithm>(algorithm),
                                        static_cast<DType>(dtype), count, segment, iters, reps);
  }, "id"_a, "collective"_a, "algorithm"_a, "dtype"_a, "count"_a, "iters"_a, "reps"_a,
        "segment"_a = 0);
  m.def("virtual_exchange_bench", [](int64_t id, int collective, int algorithm, int dtype,
                                     int64_t count, std::vector<int64_t> dests, int iters,
                                     int reps) {
    VirtualGroup& g = group_of(id);
    nb::gil_scoped_release release;
    return virtual_exchange_bench(g, static_cast<Collective>(collective),
                                  static_cast<Algorithm>(algorithm), static_cast<DType>(dtype),
                                  count, dests, iters, reps);
  }, "id"_a, "collective"_a, "algorithm"_a, "dtype"_a, "count"_a, "dests"_a, "iters"_a, "reps"_a);
  m.def("virtual_ragged_bench", [](int64_t id, int algorithm, int dtype, int64_t operand_rows,
                                   int64_t output_rows, int64_t row_elems,
                                   std::vector<int32_t> sizes, int iters, int reps) {
    VirtualGroup& g = group_of(id);
    RaggedCase c{"", "", operand_rows, output_rows, row_elems, std::move(sizes)};
    nb::gil_scoped_release release;
    return virtual_ragged_bench(g, static_cast<Algorithm>(algorithm), static_cast<DType>(dtype), c,
                                iters, reps);
  }, "id"_a, "algorithm"_a, "dtype"_a, "operand_rows"_a, "output_rows"_a, "row_elems"_a,
        "sizes"_a, "iters"_a, "reps"_a);
  m.def("virtual_floor", [](int64_t id, int iters, int reps, bool one_launch) {
    VirtualGroup& g = group_of(id);
    nb::gil_scoped_release release;
    return virtual_floor(g, iters, reps, one_launch);
  }, "id"_a, "iters"_a, "reps"_a, "one_launch"_a = false);
}

void bind_probes(nb::module_& m) {
  m.def("probe_l2_fence_us", [](int device, int iters, bool with_store) {
    nb::gil_scoped_release release;
    return probe_l2_fence_us(device, iters, with_store);
  }, "device"_a, "iters"_a, "with_store"_a = false,
        "Microseconds per __threadfence() (the L2 round trip), or per store + fence.");
  m.def("probe_pingpong_one_way_us", [](int a, int b, int iters) {
    nb::gil_scoped_release release;
    return probe_pingpong_one_way_us(a, b, iters);
  }, "device_a"_a, "device_b"_a, "iters"_a,
        "One-way latency of a flag ping-pong between a block on each device (may be equal).");
}

}  // namespace

void bind_drivers(nb::module_& m) {
  bind_checks(m);
  bind_timing(m);
  bind_probes(m);
}

}  // namespace jaxll
