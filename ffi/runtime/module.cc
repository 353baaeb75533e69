// The Python extension module jaxll._jaxll: FFI handler capsules, workspace
// management and the virtual-rank testing tools.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <nanobind/stl/string.h>

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../kernels/all_reduce.h"
#include "extension_api.h"
#include "ffi_handlers.h"
#include "jaxll/error_word.h"
#include "jaxll/workspace_layout.h"
#include "../testing/sol_probe.h"
#include "../testing/virtual_handlers.h"
#include "../testing/virtual_testing.h"
#include "workspace.h"
#include "xla/ffi/api/c_api.h"

#ifndef JAXLL_BUILT_JAXLIB_VERSION
#error "JAXLL_BUILT_JAXLIB_VERSION must be defined by the build"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace jaxll {
namespace {

// A hold on workspace `id` (keep it while using the workspace); throws if there
// is none.
WorkspaceRef workspace_or_throw(int64_t id) {
  WorkspaceRef hold(id);
  if (hold.get() == nullptr) {
    throw std::runtime_error("jaxll workspace " + std::to_string(id) + " does not exist");
  }
  return hold;
}

// Binds `name`(id): `op` on the workspace, without the GIL (it may wait for the
// devices).
template <class Op>
void def_workspace_op(nb::module_& m, const char* name, Op op, const char* doc) {
  m.def(name, [op](int64_t id) {
    const WorkspaceRef hold = workspace_or_throw(id);
    Workspace& c = *hold;
    nb::gil_scoped_release release;
    op(c);
  }, "id"_a, doc);
}

// The fused kernel's exchange from its code (rmsnorm_protocol_name's table).
RmsNormProtocol rmsnorm_protocol(int code) {
  if (rmsnorm_protocol_name(code) == nullptr) {
    throw std::invalid_argument("all_reduce_rmsnorm: unknown protocol code " + std::to_string(code));
  }
  return static_cast<RmsNormProtocol>(code);
}

template <class Fn>
nb::capsule handler_capsule(Fn* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace
}  // namespace jaxll

NB_MODULE(_jaxll, m) {
  using namespace jaxll;
  m.doc() = "jaxll native extension: XLA FFI handlers, symmetric workspaces, testing tools";
  // the testing tools' kernels load with every workspace, as jaxll's own do
  register_preloaded_kernels(testing_kernel_functions());

  m.attr("built_jaxlib_version") = JAXLL_BUILT_JAXLIB_VERSION;
  m.attr("ffi_api_version") = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
  m.attr("built_cuda_version") = CUDART_VERSION;
  m.attr("max_ranks") = kMaxRanks;
  m.attr("max_blocks") = kMaxBlocks;

  m.def("handlers", [] {
    nb::dict d;
    d["jaxll_all_reduce"] = handler_capsule(&jaxll_all_reduce_handler);
    d["jaxll_virtual_all_reduce"] = handler_capsule(&jaxll_virtual_all_reduce_handler);
    d["jaxll_virtual_all_reduce_graph"] = handler_capsule(&jaxll_virtual_all_reduce_graph_handler);
    d["jaxll_virtual_all_reduce_rmsnorm"] = handler_capsule(&jaxll_virtual_all_reduce_rmsnorm_handler);
    d["jaxll_virtual_all_reduce_rmsnorm_graph"] =
        handler_capsule(&jaxll_virtual_all_reduce_rmsnorm_graph_handler);
    d["jaxll_device_ordinal"] = handler_capsule(&jaxll_device_ordinal_handler);
    d["jaxll_noop"] = handler_capsule(&jaxll_noop_handler);
    d["jaxll_check"] = handler_capsule(&jaxll_check_handler);
    d["jaxll_all_reduce_rmsnorm"] = handler_capsule(&jaxll_all_reduce_rmsnorm_handler);
    d["jaxll_join"] = handler_capsule(&jaxll_join_handler);
    d["jaxll_gather_scatter"] = handler_capsule(&jaxll_gather_scatter_handler);
    return d;
  }, "FFI handler capsules by target name.");

  m.def("device_count", &device_count, "Number of CUDA devices visible (0 without a driver).");
  m.def("device_memory_free", [](int ordinal) {
    DeviceGuard guard(ordinal);
    size_t free_bytes = 0, total = 0;
    check_cuda(cudaMemGetInfo(&free_bytes, &total), "querying device memory");
    return free_bytes;
  }, "ordinal"_a, "Free device memory in bytes (cudaMemGetInfo).");
  m.def("can_access_peer", [](int a, int b) {
    int ok = 0;
    check_cuda(cudaDeviceCanAccessPeer(&ok, a, b), "querying peer access");
    return ok != 0;
  }, "a"_a, "b"_a);
  m.def("peer_native_atomics", [](int a, int b) {
    int ok = 0;
    check_cuda(cudaDeviceGetP2PAttribute(&ok, cudaDevP2PAttrNativeAtomicSupported, a, b),
               "querying peer atomics");
    return ok != 0;
  }, "a"_a, "b"_a,
        "Whether device a's atomics on device b's memory are native over their link "
        "(NVLink: yes; PCIe: no, and then they are not atomic against b's own).");

  m.def("create_workspace", [](const std::vector<std::vector<int>>& groups, bool virtual_ranks,
                          size_t scratch_bytes, uint64_t timeout_ms, int max_blocks,
                          bool shared_gpu) {
    WorkspaceConfig cfg;
    cfg.scratch_bytes = scratch_bytes;
    cfg.timeout_ms = timeout_ms;
    cfg.shared_gpu = shared_gpu;
    nb::gil_scoped_release release;
    return workspace_create(groups, virtual_ranks, cfg, max_blocks);
  }, "groups"_a, "virtual_ranks"_a, "scratch_bytes"_a, "timeout_ms"_a, "max_blocks"_a = 0,
        "shared_gpu"_a = false,
        "Builds a workspace over groups of CUDA ordinals (-1: a rank in another process, "
        "then max_blocks must be the bound every process agreed on; shared_gpu: ranks of "
        "several processes share a GPU); returns its id.");
  m.def("workspace_ipc_handles", [](int64_t id) {
    std::vector<nb::bytes> out;
    const WorkspaceRef hold = workspace_or_throw(id);
    for (const std::string& h : hold->ipc_handles()) out.emplace_back(h.data(), h.size());
    return out;
  }, "id"_a, "CUDA IPC handles of the local ranks' memory, in (group, rank) order.");
  m.def("workspace_connect", [](int64_t id, const std::vector<std::vector<nb::bytes>>& handles) {
    std::vector<std::vector<std::string>> hs;
    for (const auto& g : handles) {
      hs.emplace_back();
      for (const auto& h : g) hs.back().emplace_back(h.c_str(), h.size());
    }
    const WorkspaceRef hold = workspace_or_throw(id);
    Workspace& c = *hold;
    nb::gil_scoped_release release;
    c.connect(hs);
  }, "id"_a, "handles"_a, "Maps the other processes' memory (handles[g][r], b'' for local ranks).");
  m.def("device_block_bound", [](int ordinal) {
    nb::gil_scoped_release release;
    return device_block_bound(ordinal);
  }, "ordinal"_a, "Most co-resident blocks of jaxll's kernels on a device.");
  m.def("extension_api", [] {
    return nb::capsule(static_cast<const void*>(extension_api()), "jaxll.extension_api");
  }, "A capsule holding the const jaxll::ExtensionApi* (jaxll/extension.h).");
  m.def("device_sm_count", [](int ordinal) {
    int sms = 0;
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal),
               "querying the SM count of CUDA device " + std::to_string(ordinal));
    return sms;
  }, "ordinal"_a, "Number of SMs of a device.");
  m.def("device_uuid", &device_uuid, "ordinal"_a);

  m.def("workspace_info", [](int64_t id) {
    const WorkspaceRef hold = workspace_or_throw(id);
    Workspace& c = *hold;
    nb::dict d;
    d["id"] = c.id();
    d["virtual_ranks"] = c.virtual_ranks();
    d["group_count"] = c.group_count();
    d["group_size"] = c.group_size();
    d["round_bytes"] = c.round_bytes();
    d["bytes_per_rank"] = c.bytes_per_rank();
    d["region_bytes"] = c.geometry().region_bytes;
    d["max_blocks"] = c.max_blocks();
    d["scratch_bytes"] = c.config().scratch_bytes;
    d["timeout_ms"] = c.config().timeout_ms;
    nb::list groups;
    for (int g = 0; g < c.group_count(); ++g) {
      nb::list members;
      for (int r = 0; r < c.group_size(); ++r)
        members.append(c.has_rank(g, r) ? c.rank(g, r).ordinal : -1);
      groups.append(members);
    }
    d["groups"] = groups;
    return d;
  }, "id"_a);

  m.def("workspace_errors", [](int64_t id) {
    const WorkspaceRef hold = workspace_or_throw(id);
    Workspace& c = *hold;
    nb::list out;
    for (int g = 0; g < c.group_count(); ++g) {
      for (int r = 0; r < c.group_size(); ++r) {
        if (!c.has_rank(g, r)) continue;
        const Rank& rk = c.rank(g, r);
        if (uint64_t w = c.error_word(rk)) {
          out.append(nb::make_tuple(g, r, rk.ordinal, w, c.describe_error(rk, w)));
        }
      }
    }
    return out;
  }, "id"_a, "Errors recorded by the workspace's kernels: (group, rank, ordinal, word, message).");

  def_workspace_op(m, "workspace_reset", [](Workspace& c) { c.reset(); },
        "Waits for the workspace's local devices to go idle, then puts its local ranks back in "
        "the state of a new workspace (every rank of every group must be reset before any "
        "runs a call again).");
  def_workspace_op(m, "workspace_quiesce", [](Workspace& c) { c.quiesce(); },
                   "Waits for the workspace's local devices to go idle.");
  m.def("trap_on_error", &trap_on_error, "JAXLL_ON_ERROR is 'trap' (raises on bad values).");
  m.def("describe_signature", &describe_signature, "signature"_a);
  m.def("call_signature", [](int algorithm, int dtype, int op, int64_t count) {
    return call_signature(static_cast<Algorithm>(algorithm), static_cast<DType>(dtype),
                          static_cast<ReduceOp>(op), count);
  }, "algorithm"_a, "dtype"_a, "op"_a, "count"_a);

  m.def("set_epochs", [](int64_t id, uint64_t epoch) {
    const WorkspaceRef hold = workspace_or_throw(id);
    Workspace& c = *hold;
    nb::gil_scoped_release release;
    c.set_epochs(epoch);
  }, "id"_a, "epoch"_a,
        "Testing hook: sets every block's epoch, as if that many rounds had run (devices idle).");

  m.def("free_workspace", [](int64_t id, bool keep_exported) {
    nb::gil_scoped_release release;
    return workspace_free(id, keep_exported);
  }, "id"_a, "keep_exported"_a = false,
        "Frees a workspace once its devices are idle (keep_exported: memory whose IPC "
        "handles went to other processes stays allocated until this process ends).");
  m.def("free_all", [](bool keep_exported) {
    nb::gil_scoped_release release;
    workspace_free_all(keep_exported);
  }, "keep_exported"_a = false);
  def_workspace_op(m, "workspace_close_imports", [](Workspace& c) { c.close_imports(); },
        "Unmaps the other processes' memory a workspace opened (devices idle first); "
        "the workspace must run no call after this.");
  m.def("workspace_ids", &workspace_ids);

  m.def("decode_error", [](uint64_t word) {
    const DecodedError d = decode_error(word);
    return nb::make_tuple(static_cast<int>(d.kind), d.rank, d.peer, d.block, d.epoch);
  }, "word"_a);
  m.def("encode_error", [](int kind, uint32_t rank, uint32_t peer, uint32_t block, uint32_t epoch) {
    return encode_error(static_cast<ErrorKind>(kind), rank, peer, block, epoch);
  });

  m.def("plan_all_reduce", [](int algorithm, int64_t count, int elem_bytes, int nranks,
                              size_t region_bytes, int max_blocks) {
    const ScratchGeometry geo = make_geometry(nranks, max_blocks, region_bytes);
    const LaunchPlan p = plan_all_reduce(static_cast<Algorithm>(algorithm), count, elem_bytes,
                                         nranks, geo, max_blocks);
    nb::dict d;
    d["blocks"] = p.blocks;
    d["threads"] = p.threads;
    d["units"] = p.units;
    d["span"] = p.span;
    d["round_units"] = p.round_units;
    d["rounds"] = p.rounds;
    d["last_rounds"] = p.last_rounds;
    return d;
  }, "algorithm"_a, "count"_a, "elem_bytes"_a, "nranks"_a, "region_bytes"_a, "max_blocks"_a,
        "Grid and rounds of an all-reduce (blocks == 0: it cannot run).");
  m.def("geometry", [](int nranks, int blocks, size_t region_bytes) {
    const ScratchGeometry g = make_geometry(nranks, blocks, region_bytes);
    nb::dict d;
    d["region_bytes"] = g.region_bytes;
    d["ll_offset"] = g.ll_offset;
    d["sentinel_offset"] = g.sentinel_offset;
    d["plain_offset"] = g.plain_offset;
    d["atomic_offset"] = g.atomic_offset;
    d["total_bytes"] = g.total_bytes;
    return d;
  }, "nranks"_a, "blocks"_a, "region_bytes"_a, "Layout of one rank's workspace.");
  m.def("has_kernel", [](int algorithm, int dtype, int op) {
    return has_kernel(static_cast<Algorithm>(algorithm), static_cast<DType>(dtype),
                      static_cast<ReduceOp>(op));
  }, "algorithm"_a, "dtype"_a, "op"_a);
  m.def("has_gather_scatter_kernel", [](int collective, int algorithm, int dtype) {
    return has_gather_scatter_kernel(static_cast<Collective>(collective),
                                     static_cast<Algorithm>(algorithm), static_cast<DType>(dtype));
  }, "collective"_a, "algorithm"_a, "dtype"_a);
  m.attr("last_algorithm") = kLastAlgorithm;
  m.def("codes", [] {
    auto as_dict = [](const std::vector<CodeName>& table) {
      nb::dict d;
      for (const CodeName& c : table) d[c.name] = c.code;
      return d;
    };
    nb::dict d;
    d["algorithms"] = as_dict(algorithm_codes());
    d["dtypes"] = as_dict(dtype_codes());
    d["ops"] = as_dict(op_codes());
    nb::dict protocols;  // all_reduce_rmsnorm's exchange (RmsNormProtocol)
    for (int code = 0; code < kRmsNormProtocolCount; ++code) protocols[rmsnorm_protocol_name(code)] = code;
    d["rmsnorm_protocols"] = protocols;
    nb::dict refusals;  // why each protocol, asked for, may refuse a call (rmsnorm_refusal)
    for (int code = 0; code < kRmsNormProtocolCount; ++code)
      refusals[rmsnorm_protocol_name(code)] = rmsnorm_refusal(static_cast<RmsNormProtocol>(code));
    d["rmsnorm_refusals"] = refusals;
    nb::dict collectives;  // the call signature's collective field (Collective)
    collectives["all_reduce"] = static_cast<int>(Collective::kAllReduce);
    collectives["all_reduce_rmsnorm"] = static_cast<int>(Collective::kRmsNorm);
    collectives["all_gather"] = static_cast<int>(Collective::kAllGather);
    collectives["psum_scatter"] = static_cast<int>(Collective::kReduceScatter);
    d["collectives"] = collectives;
    nb::dict kinds;  // the error word's kind field (ErrorKind, jaxll/error_word.h)
    kinds["none"] = static_cast<int>(ErrorKind::kNone);
    kinds["timeout"] = static_cast<int>(ErrorKind::kTimeout);
    kinds["mismatch"] = static_cast<int>(ErrorKind::kMismatch);
    kinds["freed"] = static_cast<int>(ErrorKind::kFreed);
    kinds["not_started"] = static_cast<int>(ErrorKind::kNotStarted);
    d["error_kinds"] = kinds;
    return d;
  }, "The codes of algorithms, element types, ops, the fused kernel's protocols, the call "
     "signature's collectives and the error word's kinds, by name (the one table), and why "
     "each protocol, asked for, may refuse a call.");
  m.def("rmsnorm_plan", [](int64_t id, int dtype, int64_t tokens, int64_t hidden, int protocol) {
    const WorkspaceRef hold = workspace_or_throw(id);
    Workspace& c = *hold;
    const Rank* r = nullptr;
    for (int g = 0; g < c.group_count() && r == nullptr; ++g)
      for (int k = 0; k < c.group_size() && r == nullptr; ++k)
        if (c.has_rank(g, k)) r = &c.rank(g, k);
    if (r == nullptr) throw std::runtime_error("workspace " + std::to_string(id) + " has no rank here");
    DeviceGuard guard(r->ordinal);  // (the plan's occupancy queries ask the current device)
    const RmsNormPlan p = plan_all_reduce_rmsnorm(static_cast<DType>(dtype), r->view, tokens,
                                                  hidden, rmsnorm_protocol(protocol));
    nb::dict d;
    d["blocks"] = p.blocks;
    d["threads"] = p.threads;
    d["segments"] = p.segments;
    d["rows_at_once"] = p.rows_at_once;
    d["waves"] = p.waves;
    d["cluster"] = p.cluster;
    d["slots"] = p.slots;
    d["lean"] = p.lean;
    d["protocol"] = p.proto == Proto::kSentinel ? "sentinel" : "ll";
    d["twoshot"] = p.twoshot;
    d["units"] = p.units;
    d["pdl"] = p.pdl;
    return d;
  }, "id"_a, "dtype"_a, "tokens"_a, "hidden"_a, "protocol"_a,
        "How this process's first rank of the workspace would cut a fused all_reduce_rmsnorm "
        "(blocks == 0: the protocol asked for cannot serve it).");

  m.def("virtual_stress", [](int64_t id, const std::vector<int>& algorithms, int dtype, int op,
                             const std::vector<int64_t>& counts, uint64_t seed, int max_delay_us) {
    const WorkspaceRef hold = workspace_or_throw(id);
    Workspace& c = *hold;
    std::vector<Algorithm> algs;
    for (int a : algorithms) algs.push_back(static_cast<Algorithm>(a));
    StressResult r;
    {
      nb::gil_scoped_release release;
      r = virtual_stress(c, algs, static_cast<DType>(dtype),
                         static_cast<ReduceOp>(op), counts, seed, max_delay_us);
    }
    nb::dict d;
    d["calls"] = r.calls;
    d["mismatches"] = r.mismatches;
    d["first_call"] = r.first_call;
    d["first_rank"] = r.first_rank;
    d["first_index"] = r.first_index;
    d["got_bits"] = r.got_bits;
    d["want_bits"] = r.want_bits;
    d["error"] = r.error;
    d["rank_errors"] = r.rank_errors;
    return d;
  }, "id"_a, "algorithms"_a, "dtype"_a, "op"_a, "counts"_a, "seed"_a, "max_delay_us"_a);

  m.def("virtual_calls", [](int64_t id, const std::vector<std::tuple<int, int, int, int64_t, bool, int64_t, int>>& spec) {
    const WorkspaceRef hold = workspace_or_throw(id);
    Workspace& c = *hold;
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
    nb::gil_scoped_release release;
    return virtual_calls(c, calls);
  }, "id"_a, "calls"_a,
        "One all-reduce per virtual rank, each with its own (algorithm, dtype, op, count, "
        "skip, delay_us, delay_kernels); returns each rank's count of poisoned output elements.");

  m.def("virtual_rmsnorm", [](int64_t id, int dtype, nb::bytes x, nb::bytes residual,
                              nb::bytes weight, int64_t tokens, int64_t hidden, float eps,
                              int absent, int late, int64_t delay_us, int protocol) {
    const WorkspaceRef hold = workspace_or_throw(id);
    Workspace& c = *hold;
    std::string xs(x.c_str(), x.size()), rs(residual.c_str(), residual.size()),
        ws(weight.c_str(), weight.size());
    RmsNormResult out;
    {
      nb::gil_scoped_release release;
      out = virtual_rmsnorm(c, static_cast<DType>(dtype), xs, rs, ws, tokens, hidden, eps, absent,
                            late, delay_us, rmsnorm_protocol(protocol));
    }
    return nb::make_tuple(nb::bytes(out.normed.data(), out.normed.size()),
                          nb::bytes(out.new_residual.data(), out.new_residual.size()), out.error);
  }, "id"_a, "dtype"_a, "x"_a, "residual"_a, "weight"_a, "tokens"_a, "hidden"_a, "eps"_a,
        "absent"_a = -1, "late"_a = -1, "delay_us"_a = 0, "protocol"_a = 0,
        "The fused all-reduce + residual + RMSNorm on every virtual rank (raw bytes in and out) "
        "and the first recorded error; rank `absent` (>= 0) makes no call; rank `late` (>= 0) "
        "queues its call after the others, behind a delay kernel of `delay_us`.");
  m.def("virtual_gather_scatter", [](int64_t id, int collective, int algorithm, int dtype,
                                     nb::bytes x, int64_t count) {
    const WorkspaceRef hold = workspace_or_throw(id);
    Workspace& c = *hold;
    std::string xs(x.c_str(), x.size());
    GatherScatterResult out;
    {
      nb::gil_scoped_release release;
      out = virtual_gather_scatter(c, static_cast<Collective>(collective),
                                   static_cast<Algorithm>(algorithm), static_cast<DType>(dtype), xs,
                                   count);
    }
    return nb::make_tuple(nb::bytes(out.y.data(), out.y.size()), out.error);
  }, "id"_a, "collective"_a, "algorithm"_a, "dtype"_a, "x"_a, "count"_a,
        "One all-gather (collective 2) or reduce-scatter (3) of pieces of `count` elements on "
        "every virtual rank (raw bytes in and out) and the first recorded error.");
  m.def("virtual_gather_scatter_bench", [](int64_t id, int collective, int algorithm, int dtype,
                                           int64_t count, int iters, int reps) {
    const WorkspaceRef hold = workspace_or_throw(id);
    Workspace& c = *hold;
    nb::gil_scoped_release release;
    return virtual_gather_scatter_bench(c, static_cast<Collective>(collective),
                                        static_cast<Algorithm>(algorithm), static_cast<DType>(dtype),
                                        count, iters, reps);
  }, "id"_a, "collective"_a, "algorithm"_a, "dtype"_a, "count"_a, "iters"_a, "reps"_a);
  m.def("virtual_rmsnorm_bench", [](int64_t id, int dtype, int64_t tokens, int64_t hidden,
                                    int iters, int reps, int protocol, bool one_launch) {
    const WorkspaceRef hold = workspace_or_throw(id);
    Workspace& c = *hold;
    const RmsNormProtocol p = rmsnorm_protocol(protocol);
    nb::gil_scoped_release release;
    return virtual_rmsnorm_bench(c, static_cast<DType>(dtype), tokens, hidden, iters, reps, p,
                                 one_launch);
  }, "id"_a, "dtype"_a, "tokens"_a, "hidden"_a, "iters"_a, "reps"_a, "protocol"_a = 0,
        "one_launch"_a = false);
  m.def("virtual_bench", [](int64_t id, int algorithm, int dtype, int op, int64_t count, int iters,
                            int reps, bool one_launch) {
    const WorkspaceRef hold = workspace_or_throw(id);
    Workspace& c = *hold;
    nb::gil_scoped_release release;
    return virtual_bench(c, static_cast<Algorithm>(algorithm), static_cast<DType>(dtype),
                         static_cast<ReduceOp>(op), count, iters, reps, one_launch);
  }, "id"_a, "algorithm"_a, "dtype"_a, "op"_a, "count"_a, "iters"_a, "reps"_a,
        "one_launch"_a = false);

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

  m.def("virtual_floor", [](int64_t id, int iters, int reps, bool one_launch) {
    const WorkspaceRef hold = workspace_or_throw(id);
    Workspace& c = *hold;
    nb::gil_scoped_release release;
    return virtual_floor(c, iters, reps, one_launch);
  }, "id"_a, "iters"_a, "reps"_a, "one_launch"_a = false);
}
