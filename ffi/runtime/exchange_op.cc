// The ppermute and all-to-all ops: their XLA FFI handlers (jaxll_ppermute,
// jaxll_all_to_all) and their binding (which kernels exist).
#include <nanobind/nanobind.h>

#include <string>

#include "kernels/exchange.h"
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

// ppermute over the workspace's group: rank r sends to rank (dests >> 4r) & 15
// where bit r of `senders` is set, and to nobody where it is clear; a rank
// that no rank sends to gets zeros. x and y of one element type and count;
// `order` and `uses_pdl` as for jaxll_all_reduce. Command-buffer compatible.
ffi::Error PermuteExecute(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x,
                          ffi::AnyBuffer /*order*/, ffi::Result<ffi::AnyBuffer> y,
                          ffi::Result<ffi::AnyBuffer> /*order_out*/, int64_t workspace_id,
                          int64_t algorithm, int64_t dests, int64_t senders, bool uses_pdl) {
  const WorkspaceRef hold(workspace_id);
  Workspace* c = nullptr;
  Rank* r = nullptr;
  if (ffi::Error e = find_rank(hold, workspace_id, ordinal, &c, &r); e.failure()) return e;
  DType dtype;
  if (ffi::Error e = to_dtype(x.element_type(), &dtype); e.failure()) return e;
  const int n = r->view.nranks;
  const int64_t count = static_cast<int64_t>(x.element_count());
  if (y->element_type() != x.element_type() || y->element_count() != x.element_count()) {
    return ffi::Error::InvalidArgument("jaxll: ppermute output must hold its input's elements, "
                                       "of its type");
  }
  // each rank's destination, checked: in the group, none taken twice
  int64_t to[kMaxRanks];
  bool taken[kMaxRanks] = {};
  for (int s = 0; s < n; ++s) {
    to[s] = (senders >> s) & 1 ? (static_cast<uint64_t>(dests) >> (4 * s)) & 0xF : -1;
    if (to[s] >= n || (to[s] >= 0 && taken[to[s]])) {
      return ffi::Error::InvalidArgument(
          "jaxll: ppermute permutation is not one of a group of " + std::to_string(n) +
          " (a destination out of range or taken twice)");
    }
    if (to[s] >= 0) taken[to[s]] = true;
  }
  if (((static_cast<uint64_t>(senders)) >> n) != 0) {
    return ffi::Error::InvalidArgument("jaxll: ppermute permutation names a rank outside a group of " +
                                       std::to_string(n));
  }
  if (count == 0) return ffi::Error::Success();
  const int rank = r->view.rank;
  int src = -1;
  for (int s = 0; s < n; ++s) {
    if (to[s] == rank) src = s;
  }
  if (ffi::Error e = use_device(ordinal); e.failure()) return e;
  const Status st = launch_ppermute(static_cast<Algorithm>(algorithm), dtype, call_view(*r, uses_pdl),
                                    x.untyped_data(), y->untyped_data(), count,
                                    static_cast<int>(to[rank]), src, permutation_tag(to, n), stream);
  return status_error(st, "a ppermute of " + std::to_string(count) + " elements", workspace_id);
}

// all-to-all over the workspace's group: pieces of `count` = the input's
// element count over the group size, the input's cut into segments of
// `in_segment` elements and the output's of `out_segment` (exchange.h).
ffi::Error AllToAllExecute(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x,
                           ffi::AnyBuffer /*order*/, ffi::Result<ffi::AnyBuffer> y,
                           ffi::Result<ffi::AnyBuffer> /*order_out*/, int64_t workspace_id,
                           int64_t algorithm, int64_t in_segment, int64_t out_segment,
                           bool uses_pdl) {
  const WorkspaceRef hold(workspace_id);
  Workspace* c = nullptr;
  Rank* r = nullptr;
  if (ffi::Error e = find_rank(hold, workspace_id, ordinal, &c, &r); e.failure()) return e;
  DType dtype;
  if (ffi::Error e = to_dtype(x.element_type(), &dtype); e.failure()) return e;
  const int64_t n = r->view.nranks;
  const int64_t in = static_cast<int64_t>(x.element_count());
  if (y->element_type() != x.element_type() || static_cast<int64_t>(y->element_count()) != in ||
      in % n != 0) {
    return ffi::Error::InvalidArgument("jaxll: all_to_all output must hold its input's elements, "
                                       "of its type, a whole number of pieces per rank");
  }
  const int64_t count = in / n;
  if (count == 0) return ffi::Error::Success();
  const Algorithm a = static_cast<Algorithm>(algorithm);
  if (!segments_fit(count, in_segment) || !segments_fit(count, out_segment)) {
    return ffi::Error::InvalidArgument(
        "jaxll: all_to_all pieces of " + std::to_string(count) + " elements cannot be cut into " +
        "segments of " + std::to_string(in_segment) + " and " + std::to_string(out_segment) +
        " (a segment must divide the piece)");
  }
  if (ffi::Error e = use_device(ordinal); e.failure()) return e;
  const Status s = launch_all_to_all(a, dtype, call_view(*r, uses_pdl), x.untyped_data(),
                                     y->untyped_data(), count, in_segment, out_segment, stream);
  return status_error(s, "an all_to_all of pieces of " + std::to_string(count) + " elements",
                      workspace_id);
}

#define JAXLL_PERMUTE_OPERANDS \
  .Arg<ffi::AnyBuffer>()       \
  .Arg<ffi::AnyBuffer>()       \
  .Ret<ffi::AnyBuffer>()       \
  .Ret<ffi::AnyBuffer>()       \
  .Attr<int64_t>("workspace")  \
  .Attr<int64_t>("algorithm")  \
  .Attr<int64_t>("dests")      \
  .Attr<int64_t>("senders")    \
  .Attr<bool>("uses_pdl")

#define JAXLL_ALL_TO_ALL_OPERANDS \
  .Arg<ffi::AnyBuffer>()          \
  .Arg<ffi::AnyBuffer>()          \
  .Ret<ffi::AnyBuffer>()          \
  .Ret<ffi::AnyBuffer>()          \
  .Attr<int64_t>("workspace")     \
  .Attr<int64_t>("algorithm")     \
  .Attr<int64_t>("in_segment")    \
  .Attr<int64_t>("out_segment")   \
  .Attr<bool>("uses_pdl")

XLA_FFI_DEFINE_HANDLER(kPermuteHandler, PermuteExecute,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<cudaStream_t>>()
                           .Ctx<ffi::DeviceOrdinal>() JAXLL_PERMUTE_OPERANDS,
                       {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER(kAllToAllHandler, AllToAllExecute,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<cudaStream_t>>()
                           .Ctx<ffi::DeviceOrdinal>() JAXLL_ALL_TO_ALL_OPERANDS,
                       {ffi::Traits::kCmdBufferCompatible});

#if JAXLL_RECORD_STAGE
ffi::Error PermuteRecord(RecordContext ctx, int32_t ordinal, ffi::AnyBuffer x, ffi::AnyBuffer order,
                         ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> order_out,
                         int64_t workspace_id, int64_t algorithm, int64_t dests, int64_t senders,
                         bool uses_pdl) {
  return record_call(ctx, [&](cudaStream_t stream) {
    return PermuteExecute(stream, ordinal, x, order, y, order_out, workspace_id, algorithm, dests,
                          senders, uses_pdl);
  });
}
ffi::Error AllToAllRecord(RecordContext ctx, int32_t ordinal, ffi::AnyBuffer x,
                          ffi::AnyBuffer order, ffi::Result<ffi::AnyBuffer> y,
                          ffi::Result<ffi::AnyBuffer> order_out, int64_t workspace_id,
                          int64_t algorithm, int64_t in_segment, int64_t out_segment,
                          bool uses_pdl) {
  return record_call(ctx, [&](cudaStream_t stream) {
    return AllToAllExecute(stream, ordinal, x, order, y, order_out, workspace_id, algorithm,
                           in_segment, out_segment, uses_pdl);
  });
}

XLA_FFI_DEFINE_HANDLER(kPermuteRecord, PermuteRecord,
                       ffi::Ffi::BindRecord()
                           .Ctx<RecordCtx>()
                           .Ctx<ffi::DeviceOrdinal>() JAXLL_PERMUTE_OPERANDS);
XLA_FFI_DEFINE_HANDLER(kAllToAllRecord, AllToAllRecord,
                       ffi::Ffi::BindRecord()
                           .Ctx<RecordCtx>()
                           .Ctx<ffi::DeviceOrdinal>() JAXLL_ALL_TO_ALL_OPERANDS);
#endif

}  // namespace

void bind_exchange(nb::module_& m, HandlerTable& handlers) {
  handlers.add("jaxll_ppermute", kPermuteHandler, true, JAXLL_RECORD_HANDLER(kPermuteRecord));
  handlers.add("jaxll_all_to_all", kAllToAllHandler, true, JAXLL_RECORD_HANDLER(kAllToAllRecord));
  m.def("has_exchange_kernel", [](int collective, int algorithm, int dtype) {
    return has_exchange_kernel(static_cast<Collective>(collective),
                               static_cast<Algorithm>(algorithm), static_cast<DType>(dtype));
  }, "collective"_a, "algorithm"_a, "dtype"_a);
}

}  // namespace jaxll
