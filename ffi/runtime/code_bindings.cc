// The one table of codes Python reads (algorithms, element types, operators,
// the fused call's exchanges and their refusals, collectives, error kinds), and
// the coding of signatures, error words and workspace layouts.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "jaxll/error_word.h"
#include "jaxll/workspace_layout.h"
#include "kernels/rmsnorm.h"
#include "kernels/types.h"
#include "runtime/bindings.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace jaxll {
namespace {

nb::dict as_dict(const std::vector<CodeName>& table) {
  nb::dict d;
  for (const CodeName& c : table) d[c.name] = c.code;
  return d;
}

nb::dict codes() {
  nb::dict d;
  d["algorithms"] = as_dict(algorithm_codes());
  d["dtypes"] = as_dict(dtype_codes());
  d["ops"] = as_dict(op_codes());
  d["collectives"] = as_dict(collective_codes());
  nb::dict protocols, refusals;  // the fused call's exchanges, and why each may refuse a call
  for (RmsNormProtocol p : kRmsNormProtocols) {
    const char* name = rmsnorm_protocol_name(static_cast<int>(p));
    protocols[name] = static_cast<int>(p);
    refusals[name] = rmsnorm_refusal(p);
  }
  d["rmsnorm_protocols"] = protocols;
  d["rmsnorm_refusals"] = refusals;
  nb::dict kinds;  // the error word's kind field (jaxll/error_word.h)
  kinds["none"] = static_cast<int>(ErrorKind::kNone);
  kinds["timeout"] = static_cast<int>(ErrorKind::kTimeout);
  kinds["mismatch"] = static_cast<int>(ErrorKind::kMismatch);
  kinds["freed"] = static_cast<int>(ErrorKind::kFreed);
  kinds["not_started"] = static_cast<int>(ErrorKind::kNotStarted);
  kinds["ragged"] = static_cast<int>(ErrorKind::kRagged);
  d["error_kinds"] = kinds;
  return d;
}

}  // namespace

void bind_codes(nb::module_& m) {
  m.attr("max_ranks") = kMaxRanks;
  m.attr("max_blocks") = kMaxBlocks;
  m.attr("last_algorithm") = kLastAlgorithm;
  m.def("codes", &codes,
        "The codes of algorithms, element types, ops, collectives, the fused call's exchanges "
        "and the error word's kinds, by name (the one table), and why each exchange, asked "
        "for, may refuse a call.");
  m.def("describe_signature", &describe_signature, "signature"_a);
  m.def("decode_error", [](uint64_t word) {
    const DecodedError d = decode_error(word);
    return nb::make_tuple(static_cast<int>(d.kind), d.rank, d.peer, d.block, d.epoch);
  }, "word"_a);
  m.def("encode_error", [](int kind, uint32_t rank, uint32_t peer, uint32_t block, uint32_t epoch) {
    return encode_error(static_cast<ErrorKind>(kind), rank, peer, block, epoch);
  });
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
}

}  // namespace jaxll
