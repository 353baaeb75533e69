// The fused all-reduce + residual + RMSNorm op: its XLA FFI handler
// (jaxll_all_reduce_rmsnorm) and its binding (how a rank of a workspace would
// cut a call, for the lowering's choice of exchange).
#include <nanobind/nanobind.h>

#include <stdexcept>
#include <string>

#include "kernels/rmsnorm.h"
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

// All-reduce of x over the workspace's group + residual + RMSNorm with weight
// (x, residual, normed, new_residual: (..., hidden); weight: (hidden,); one
// element type), on the exchange `protocol_code`; `order` and `uses_pdl` as
// for jaxll_all_reduce. Command-buffer compatible.
ffi::Error RmsNormExecute(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x,
                          ffi::AnyBuffer residual, ffi::AnyBuffer weight, ffi::AnyBuffer /*order*/,
                          ffi::Result<ffi::AnyBuffer> normed,
                          ffi::Result<ffi::AnyBuffer> new_residual,
                          ffi::Result<ffi::AnyBuffer> /*order_out*/, int64_t workspace_id, float eps,
                          int32_t protocol_code, bool uses_pdl) {
  const WorkspaceRef hold(workspace_id);
  Workspace* c = nullptr;
  Rank* r = nullptr;
  if (ffi::Error e = find_rank(hold, workspace_id, ordinal, &c, &r); e.failure()) return e;
  RmsNormProtocol protocol;
  if (ffi::Error e = to_rmsnorm_protocol(protocol_code, &protocol); e.failure()) return e;
  DType dtype;
  if (ffi::Error e = to_dtype(x.element_type(), &dtype); e.failure()) return e;
  const auto dims = x.dimensions();
  if (dims.size() < 1) return ffi::Error::InvalidArgument("jaxll: all_reduce_rmsnorm needs a hidden axis");
  const int64_t hidden = dims[dims.size() - 1];
  const int64_t count = static_cast<int64_t>(x.element_count());
  if (!rmsnorm_operands_match(x, residual, weight, *normed, *new_residual, hidden)) {
    return ffi::Error::InvalidArgument(
        "jaxll: all_reduce_rmsnorm takes x, residual (x's shape) and weight (hidden,) of one "
        "element type, and returns two arrays of x's shape");
  }
  if (count == 0) return ffi::Error::Success();
  const RankView view = call_view(*r, uses_pdl);
  if (const char* problem = rmsnorm_unsupported(dtype, hidden, view)) {
    return ffi::Error::InvalidArgument(std::string("jaxll: all_reduce_rmsnorm kernel: unsupported ") +
                                       problem);
  }
  if (ffi::Error e = use_device(ordinal); e.failure()) return e;
  const Status s = launch_all_reduce_rmsnorm(
      dtype, view, x.untyped_data(), residual.untyped_data(), weight.untyped_data(),
      normed->untyped_data(), new_residual->untyped_data(), count / hidden, hidden, eps, protocol,
      stream);
  return rmsnorm_status_error(s, "an all_reduce_rmsnorm of " + std::to_string(count) + " elements",
                              workspace_id, protocol);
}

// The operands, results and attributes of the call (both stages bind them).
#define JAXLL_RMSNORM_OPERANDS   \
  .Arg<ffi::AnyBuffer>()         \
  .Arg<ffi::AnyBuffer>()         \
  .Arg<ffi::AnyBuffer>()         \
  .Arg<ffi::AnyBuffer>()         \
  .Ret<ffi::AnyBuffer>()         \
  .Ret<ffi::AnyBuffer>()         \
  .Ret<ffi::AnyBuffer>()         \
  .Attr<int64_t>("workspace")    \
  .Attr<float>("eps")            \
  .Attr<int32_t>("protocol")     \
  .Attr<bool>("uses_pdl")

XLA_FFI_DEFINE_HANDLER(kRmsNormHandler, RmsNormExecute,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<cudaStream_t>>()
                           .Ctx<ffi::DeviceOrdinal>() JAXLL_RMSNORM_OPERANDS,
                       {ffi::Traits::kCmdBufferCompatible});

#if JAXLL_RECORD_STAGE
ffi::Error RmsNormRecord(RecordContext ctx, int32_t ordinal, ffi::AnyBuffer x,
                         ffi::AnyBuffer residual, ffi::AnyBuffer weight, ffi::AnyBuffer order,
                         ffi::Result<ffi::AnyBuffer> normed,
                         ffi::Result<ffi::AnyBuffer> new_residual,
                         ffi::Result<ffi::AnyBuffer> order_out, int64_t workspace_id, float eps,
                         int32_t protocol_code, bool uses_pdl) {
  return record_call(ctx, [&](cudaStream_t stream) {
    return RmsNormExecute(stream, ordinal, x, residual, weight, order, normed, new_residual,
                          order_out, workspace_id, eps, protocol_code, uses_pdl);
  });
}

XLA_FFI_DEFINE_HANDLER(kRmsNormRecord, RmsNormRecord,
                       ffi::Ffi::BindRecord()
                           .Ctx<RecordCtx>()
                           .Ctx<ffi::DeviceOrdinal>() JAXLL_RMSNORM_OPERANDS);
#endif

// The protocol of code `code` (the FFI attribute's values), or std::invalid_argument.
RmsNormProtocol protocol_of(int code) {
  if (rmsnorm_protocol_name(code) == nullptr) {
    throw std::invalid_argument("all_reduce_rmsnorm: unknown protocol code " + std::to_string(code));
  }
  return static_cast<RmsNormProtocol>(code);
}

nb::dict plan_dict(const RmsNormPlan& p) {
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
}

}  // namespace

void bind_all_reduce_rmsnorm(nb::module_& m, HandlerTable& handlers) {
  handlers.add("jaxll_all_reduce_rmsnorm", kRmsNormHandler, true,
               JAXLL_RECORD_HANDLER(kRmsNormRecord));
  m.def("rmsnorm_plan", [](int64_t id, int dtype, int64_t tokens, int64_t hidden, int protocol) {
    const RmsNormProtocol p = protocol_of(protocol);
    const WorkspaceRef hold(id);
    if (hold.get() == nullptr) {
      throw std::runtime_error("jaxll workspace " + std::to_string(id) + " does not exist");
    }
    const Workspace& c = *hold;
    const Rank* r = nullptr;
    for (int g = 0; g < c.group_count() && r == nullptr; ++g)
      for (int k = 0; k < c.group_size() && r == nullptr; ++k)
        if (c.has_rank(g, k)) r = &c.rank(g, k);
    if (r == nullptr) throw std::runtime_error("workspace " + std::to_string(id) + " has no rank here");
    DeviceGuard guard(r->ordinal);  // (the plan's occupancy queries ask the current device)
    return plan_dict(plan_all_reduce_rmsnorm(static_cast<DType>(dtype), r->view, tokens, hidden, p));
  }, "id"_a, "dtype"_a, "tokens"_a, "hidden"_a, "protocol"_a,
        "How this process's first rank of the workspace would cut a fused all_reduce_rmsnorm "
        "on exchange `protocol` (blocks == 0: that exchange cannot serve it).");
}

}  // namespace jaxll
