// The ragged all-to-all op: its XLA FFI handler (jaxll_ragged_all_to_all) and
// its binding (which kernels exist).
#include <nanobind/nanobind.h>

#include <string>

#include "kernels/ragged.h"
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

// Rows of a buffer (its first dimension) and elements a row.
bool rows_of(const ffi::AnyBuffer& b, int64_t* rows, int64_t* row_elems) {
  const auto dims = b.dimensions();
  if (dims.size() < 1) return false;
  *rows = dims[0];
  *row_elems = 1;
  for (size_t i = 1; i < dims.size(); ++i) *row_elems *= dims[i];
  return true;
}

// jax.lax.ragged_all_to_all over the workspace's group (kernels/ragged.h):
// `operand` rows go to the peers' `output`s as the int32 offset and size
// arrays (group size x slices a peer each) say; the result is `output`
// updated in place (the lowering aliases them). `order` and `uses_pdl` as for
// jaxll_all_reduce. Command-buffer compatible.
ffi::Error RaggedExecute(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer operand,
                         ffi::AnyBuffer output, ffi::AnyBuffer input_offsets,
                         ffi::AnyBuffer send_sizes, ffi::AnyBuffer output_offsets,
                         ffi::AnyBuffer recv_sizes, ffi::AnyBuffer /*order*/,
                         ffi::Result<ffi::AnyBuffer> result,
                         ffi::Result<ffi::AnyBuffer> /*order_out*/, int64_t workspace_id,
                         int64_t algorithm, bool uses_pdl) {
  const WorkspaceRef hold(workspace_id);
  Workspace* c = nullptr;
  Rank* r = nullptr;
  if (ffi::Error e = find_rank(hold, workspace_id, ordinal, &c, &r); e.failure()) return e;
  DType dtype;
  if (ffi::Error e = to_dtype(operand.element_type(), &dtype); e.failure()) return e;
  const int64_t n = r->view.nranks;
  int64_t in_rows, out_rows, row_elems, out_row_elems;
  if (!rows_of(operand, &in_rows, &row_elems) || !rows_of(output, &out_rows, &out_row_elems) ||
      output.element_type() != operand.element_type() || result->element_type() !=
      operand.element_type() || result->element_count() != output.element_count() ||
      (row_elems != out_row_elems && in_rows * out_rows != 0)) {
    return ffi::Error::InvalidArgument(
        "jaxll: ragged_all_to_all operand and output must be arrays of one element type whose "
        "rows have the same shape, and the result must be the output's shape");
  }
  const int64_t k = static_cast<int64_t>(input_offsets.element_count());
  for (const ffi::AnyBuffer* a : {&input_offsets, &send_sizes, &output_offsets, &recv_sizes}) {
    if (a->element_type() != ffi::DataType::S32 || static_cast<int64_t>(a->element_count()) != k) {
      return ffi::Error::InvalidArgument(
          "jaxll: ragged_all_to_all offsets and sizes must be int32 arrays of one length");
    }
  }
  if (k == 0 || k % n != 0 || k / n > kMaxRaggedSlices) {
    return ffi::Error::InvalidArgument(
        "jaxll: ragged_all_to_all offsets and sizes hold " + std::to_string(k) +
        " entries: a multiple of the group size " + std::to_string(n) + ", at most " +
        std::to_string(kMaxRaggedSlices) + " a peer");
  }
  if (result->untyped_data() != output.untyped_data()) {
    return ffi::Error::InvalidArgument(
        "jaxll: ragged_all_to_all's result must be its output buffer (operand_output_aliases)");
  }
  if (row_elems == 0 || in_rows == 0 || out_rows == 0) return ffi::Error::Success();
  if (ffi::Error e = use_device(ordinal); e.failure()) return e;
  RaggedCall call{operand.untyped_data(),
                  result->untyped_data(),
                  in_rows,
                  out_rows,
                  row_elems,
                  static_cast<const int32_t*>(input_offsets.untyped_data()),
                  static_cast<const int32_t*>(send_sizes.untyped_data()),
                  static_cast<const int32_t*>(output_offsets.untyped_data()),
                  static_cast<const int32_t*>(recv_sizes.untyped_data()),
                  static_cast<int>(k / n)};
  const Status s = launch_ragged_all_to_all(static_cast<Algorithm>(algorithm), dtype,
                                            call_view(*r, uses_pdl), call, stream);
  return status_error(s, "a ragged_all_to_all of " + std::to_string(in_rows) + " rows", workspace_id);
}

#define JAXLL_RAGGED_OPERANDS   \
  .Arg<ffi::AnyBuffer>()        \
  .Arg<ffi::AnyBuffer>()        \
  .Arg<ffi::AnyBuffer>()        \
  .Arg<ffi::AnyBuffer>()        \
  .Arg<ffi::AnyBuffer>()        \
  .Arg<ffi::AnyBuffer>()        \
  .Arg<ffi::AnyBuffer>()        \
  .Ret<ffi::AnyBuffer>()        \
  .Ret<ffi::AnyBuffer>()        \
  .Attr<int64_t>("workspace")   \
  .Attr<int64_t>("algorithm")   \
  .Attr<bool>("uses_pdl")

XLA_FFI_DEFINE_HANDLER(kRaggedHandler, RaggedExecute,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<cudaStream_t>>()
                           .Ctx<ffi::DeviceOrdinal>() JAXLL_RAGGED_OPERANDS,
                       {ffi::Traits::kCmdBufferCompatible});

#if JAXLL_RECORD_STAGE
ffi::Error RaggedRecord(RecordContext ctx, int32_t ordinal, ffi::AnyBuffer operand,
                        ffi::AnyBuffer output, ffi::AnyBuffer input_offsets,
                        ffi::AnyBuffer send_sizes, ffi::AnyBuffer output_offsets,
                        ffi::AnyBuffer recv_sizes, ffi::AnyBuffer order,
                        ffi::Result<ffi::AnyBuffer> result, ffi::Result<ffi::AnyBuffer> order_out,
                        int64_t workspace_id, int64_t algorithm, bool uses_pdl) {
  return record_call(ctx, [&](cudaStream_t stream) {
    return RaggedExecute(stream, ordinal, operand, output, input_offsets, send_sizes,
                         output_offsets, recv_sizes, order, result, order_out, workspace_id,
                         algorithm, uses_pdl);
  });
}

XLA_FFI_DEFINE_HANDLER(kRaggedRecord, RaggedRecord,
                       ffi::Ffi::BindRecord()
                           .Ctx<RecordCtx>()
                           .Ctx<ffi::DeviceOrdinal>() JAXLL_RAGGED_OPERANDS);
#endif

}  // namespace

void bind_ragged_all_to_all(nb::module_& m, HandlerTable& handlers) {
  handlers.add("jaxll_ragged_all_to_all", kRaggedHandler, true,
               JAXLL_RECORD_HANDLER(kRaggedRecord));
  m.def("has_ragged_kernel", [](int algorithm, int dtype) {
    return has_ragged_kernel(static_cast<Algorithm>(algorithm), static_cast<DType>(dtype));
  }, "algorithm"_a, "dtype"_a);
}

}  // namespace jaxll
