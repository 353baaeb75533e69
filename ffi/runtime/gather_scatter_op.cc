// The all-gather and reduce-scatter op: its XLA FFI handler
// (jaxll_gather_scatter) and its binding (which kernels exist).
#include <nanobind/nanobind.h>

#include <string>

#include "kernels/gather_scatter.h"
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

// All-gather (collective 2) or reduce-scatter (3) over the workspace's group,
// pieces of `count` = the output's (gather: input's) element count over the
// group size, cut into segments of `segment` elements (gather_scatter.h); x and
// y of one element type; `order` and `uses_pdl` as for jaxll_all_reduce.
// Command-buffer compatible.
ffi::Error GatherScatterExecute(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x,
                                ffi::AnyBuffer /*order*/, ffi::Result<ffi::AnyBuffer> y,
                                ffi::Result<ffi::AnyBuffer> /*order_out*/, int64_t workspace_id,
                                int64_t collective, int64_t algorithm, int64_t segment,
                                bool uses_pdl) {
  const WorkspaceRef hold(workspace_id);
  Workspace* c = nullptr;
  Rank* r = nullptr;
  if (ffi::Error e = find_rank(hold, workspace_id, ordinal, &c, &r); e.failure()) return e;
  const Collective kind = static_cast<Collective>(collective);
  if (kind != Collective::kAllGather && kind != Collective::kReduceScatter) {
    return ffi::Error::InvalidArgument("jaxll: unknown collective code " + std::to_string(collective));
  }
  const bool gather = kind == Collective::kAllGather;
  const std::string name = gather ? "all_gather" : "psum_scatter";
  DType dtype;
  if (ffi::Error e = to_dtype(x.element_type(), &dtype); e.failure()) return e;
  const int64_t n = r->view.nranks;
  const int64_t in = static_cast<int64_t>(x.element_count());
  const int64_t out = static_cast<int64_t>(y->element_count());
  const int64_t count = gather ? in : out;
  if (y->element_type() != x.element_type() || (gather ? out != in * n : in != out * n)) {
    return ffi::Error::InvalidArgument("jaxll: " + name + " output must hold " +
                                       (gather ? "group size x" : "1 / group size of") +
                                       " its input's elements, of its type");
  }
  if (count == 0) return ffi::Error::Success();
  if (!segments_fit(count, segment)) {
    return ffi::Error::InvalidArgument(
        "jaxll: " + name + " pieces of " + std::to_string(count) + " elements cannot be cut " +
        "into segments of " + std::to_string(segment) + " (a segment must divide the piece)");
  }
  if (ffi::Error e = use_device(ordinal); e.failure()) return e;
  const Status s = launch_gather_scatter(kind, static_cast<Algorithm>(algorithm), dtype,
                                         call_view(*r, uses_pdl), x.untyped_data(),
                                         y->untyped_data(), count, segment, stream);
  return status_error(s, "a " + name + " of pieces of " + std::to_string(count) + " elements",
                      workspace_id);
}

// The operands, results and attributes of the call (both stages bind them).
#define JAXLL_GATHER_SCATTER_OPERANDS \
  .Arg<ffi::AnyBuffer>()              \
  .Arg<ffi::AnyBuffer>()              \
  .Ret<ffi::AnyBuffer>()              \
  .Ret<ffi::AnyBuffer>()              \
  .Attr<int64_t>("workspace")         \
  .Attr<int64_t>("collective")        \
  .Attr<int64_t>("algorithm")         \
  .Attr<int64_t>("segment")           \
  .Attr<bool>("uses_pdl")

XLA_FFI_DEFINE_HANDLER(kGatherScatterHandler, GatherScatterExecute,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<cudaStream_t>>()
                           .Ctx<ffi::DeviceOrdinal>() JAXLL_GATHER_SCATTER_OPERANDS,
                       {ffi::Traits::kCmdBufferCompatible});

#if JAXLL_RECORD_STAGE
ffi::Error GatherScatterRecord(RecordContext ctx, int32_t ordinal, ffi::AnyBuffer x,
                               ffi::AnyBuffer order, ffi::Result<ffi::AnyBuffer> y,
                               ffi::Result<ffi::AnyBuffer> order_out, int64_t workspace_id,
                               int64_t collective, int64_t algorithm, int64_t segment,
                               bool uses_pdl) {
  return record_call(ctx, [&](cudaStream_t stream) {
    return GatherScatterExecute(stream, ordinal, x, order, y, order_out, workspace_id, collective,
                                algorithm, segment, uses_pdl);
  });
}

XLA_FFI_DEFINE_HANDLER(kGatherScatterRecord, GatherScatterRecord,
                       ffi::Ffi::BindRecord()
                           .Ctx<RecordCtx>()
                           .Ctx<ffi::DeviceOrdinal>() JAXLL_GATHER_SCATTER_OPERANDS);
#endif

}  // namespace

void bind_gather_scatter(nb::module_& m, HandlerTable& handlers) {
  handlers.add("jaxll_gather_scatter", kGatherScatterHandler, true,
               JAXLL_RECORD_HANDLER(kGatherScatterRecord));
  m.def("has_gather_scatter_kernel", [](int collective, int algorithm, int dtype) {
    return has_gather_scatter_kernel(static_cast<Collective>(collective),
                                     static_cast<Algorithm>(algorithm), static_cast<DType>(dtype));
  }, "collective"_a, "algorithm"_a, "dtype"_a);
}

}  // namespace jaxll
