// The all-reduce op: its XLA FFI handler (jaxll_all_reduce, one rank's
// all-reduce inside an SPMD program) and its bindings (the plan, which kernels
// exist, the call signature).
#include <nanobind/nanobind.h>

#include <string>

#include "kernels/all_reduce.h"
#include "runtime/bindings.h"
#include "runtime/ffi_support.h"
#include "runtime/rank_lookup.h"
#include "runtime/record_stage.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
namespace nb = nanobind;
using namespace nb::literals;

namespace jaxll {
namespace {

// InvalidArgument for an unknown algorithm or reduction code.
ffi::Error check_codes(int64_t algorithm, int64_t op) {
  if (algorithm < 1 || algorithm > kLastAlgorithm) {
    return ffi::Error::InvalidArgument("jaxll: unknown algorithm code " + std::to_string(algorithm));
  }
  if (op < 0 || op > static_cast<int64_t>(ReduceOp::kMin)) {
    return ffi::Error::InvalidArgument("jaxll: unknown reduction code " + std::to_string(op));
  }
  return ffi::Error::Success();
}

// Command-buffer compatible: every per-call value lives on the device. `order`
// in and out: 4 bytes that chain the calls of one block so XLA keeps them in
// program order and never runs two at once (jaxll/ordering.py); never read or
// written here. `uses_pdl`: the call may start while the kernel ahead of it
// finishes, where its workspace allows (XLA reads the same attribute when it
// records the call: runtime/record_stage.h).
ffi::Error AllReduceExecute(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x,
                            ffi::AnyBuffer /*order*/, ffi::Result<ffi::AnyBuffer> y,
                            ffi::Result<ffi::AnyBuffer> /*order_out*/, int64_t workspace_id,
                            int64_t algorithm, int64_t op, bool uses_pdl) {
  const WorkspaceRef hold(workspace_id);
  Workspace* c = nullptr;
  Rank* r = nullptr;
  if (ffi::Error e = find_rank(hold, workspace_id, ordinal, &c, &r); e.failure()) return e;
  if (ffi::Error e = check_codes(algorithm, op); e.failure()) return e;
  DType dtype;
  if (ffi::Error e = to_dtype(x.element_type(), &dtype); e.failure()) return e;
  const int64_t count = static_cast<int64_t>(x.element_count());
  if (y->element_count() != x.element_count() || y->element_type() != x.element_type()) {
    return ffi::Error::InvalidArgument("jaxll: all_reduce output must match its input");
  }
  if (count == 0) return ffi::Error::Success();
  if (ffi::Error e = use_device(ordinal); e.failure()) return e;
  const Status s = launch_all_reduce(static_cast<Algorithm>(algorithm), dtype,
                                     static_cast<ReduceOp>(op), call_view(*r, uses_pdl),
                                     x.untyped_data(), y->untyped_data(), count, stream);
  return status_error(s, "an all-reduce of " + std::to_string(count) + " elements", workspace_id);
}

// The operands, results and attributes of the call (both stages bind them).
#define JAXLL_ALL_REDUCE_OPERANDS \
  .Arg<ffi::AnyBuffer>()          \
  .Arg<ffi::AnyBuffer>()          \
  .Ret<ffi::AnyBuffer>()          \
  .Ret<ffi::AnyBuffer>()          \
  .Attr<int64_t>("workspace")     \
  .Attr<int64_t>("algorithm")     \
  .Attr<int64_t>("op")            \
  .Attr<bool>("uses_pdl")

XLA_FFI_DEFINE_HANDLER(kAllReduceHandler, AllReduceExecute,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<cudaStream_t>>()
                           .Ctx<ffi::DeviceOrdinal>() JAXLL_ALL_REDUCE_OPERANDS,
                       {ffi::Traits::kCmdBufferCompatible});

#if JAXLL_RECORD_STAGE
ffi::Error AllReduceRecord(RecordContext ctx, int32_t ordinal, ffi::AnyBuffer x,
                           ffi::AnyBuffer order, ffi::Result<ffi::AnyBuffer> y,
                           ffi::Result<ffi::AnyBuffer> order_out, int64_t workspace_id,
                           int64_t algorithm, int64_t op, bool uses_pdl) {
  return record_call(ctx, [&](cudaStream_t stream) {
    return AllReduceExecute(stream, ordinal, x, order, y, order_out, workspace_id, algorithm, op,
                            uses_pdl);
  });
}

XLA_FFI_DEFINE_HANDLER(kAllReduceRecord, AllReduceRecord,
                       ffi::Ffi::BindRecord()
                           .Ctx<RecordCtx>()
                           .Ctx<ffi::DeviceOrdinal>() JAXLL_ALL_REDUCE_OPERANDS);
#endif

}  // namespace

void bind_all_reduce(nb::module_& m, HandlerTable& handlers) {
  handlers.add("jaxll_all_reduce", kAllReduceHandler, true,
               JAXLL_RECORD_HANDLER(kAllReduceRecord));
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
  m.def("has_kernel", [](int algorithm, int dtype, int op) {
    return has_kernel(static_cast<Algorithm>(algorithm), static_cast<DType>(dtype),
                      static_cast<ReduceOp>(op));
  }, "algorithm"_a, "dtype"_a, "op"_a);
  m.def("call_signature", [](int algorithm, int dtype, int op, int64_t count) {
    return call_signature(static_cast<Algorithm>(algorithm), static_cast<DType>(dtype),
                          static_cast<ReduceOp>(op), count);
  }, "algorithm"_a, "dtype"_a, "op"_a, "count"_a);
}

}  // namespace jaxll
