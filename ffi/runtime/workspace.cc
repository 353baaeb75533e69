#include "runtime/workspace.h"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "jaxll/error_word.h"
#include "jaxll/workspace_layout.h"
#include "kernels/ragged.h"
#include "kernels/types.h"

namespace jaxll {

namespace {

std::string where(const Rank& r) {
  return "group " + std::to_string(r.group) + " rank " + std::to_string(r.rank) +
         " (CUDA device " + std::to_string(r.ordinal) + ")";
}

// Whether rank kernels on CUDA device `ordinal` launch with programmatic
// dependent launch: where the workspace allows it (WorkspaceConfig::pdl) and the
// device has it (compute capability 9.0 and newer).
bool use_pdl(int ordinal, bool allowed) {
  if (!allowed) return false;
  int major = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal),
             "querying the compute capability");
  return major >= 9;
}

// The signature slots' idle content: packets ready for no epoch.
void write_idle_signatures(const Rank& r, const ScratchGeometry& geo, cudaStream_t s) {
  const size_t packets = static_cast<size_t>(geo.blocks) * 2 * geo.nranks;
  std::vector<uint64_t> idle(2 * packets);
  for (size_t i = 0; i < packets; ++i) {
    idle[2 * i] = 0;
    idle[2 * i + 1] = 1ull << 32;
  }
  check_cuda(cudaMemcpyAsync(static_cast<char*>(r.base) + geo.sig_offset, idle.data(),
                             idle.size() * sizeof(uint64_t), cudaMemcpyHostToDevice, s),
             "writing the signature slots");
  check_cuda(cudaStreamSynchronize(s), "writing the signature slots");
}

}  // namespace

void Workspace::clear_rank(Rank& r, cudaStream_t s) const {
  // Everything starts zero (header epochs and error word, flags, LL16 slots,
  // atomic lines) except the sentinel scratch, which starts poisoned, and the
  // signature slots, which start idle.
  const ScratchGeometry& geo = geo_;
  cudaError_t e = cudaMemsetAsync(r.base, 0, geo.total_bytes, s);
  if (e == cudaSuccess) {
    e = cudaMemsetAsync(static_cast<char*>(r.base) + geo.sentinel_offset, kSentinelByte,
                        geo.plain_offset - geo.sentinel_offset, s);
  }
  if (e == cudaSuccess) {
    e = cudaMemsetAsync(r.header, 0, offsetof(WorkspaceHeader, peer_bases), s);
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  check_cuda(e, "clearing the workspace of " + where(r));
  write_idle_signatures(r, geo, s);
  for (int i = 0; i < kHostErrorWords; ++i) {
    reinterpret_cast<volatile unsigned long long*>(r.host_error)[i] = 0;
  }
}

void Workspace::clear_rank(Rank& r) const {
  DeviceGuard guard(r.ordinal);
  cudaStream_t s;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "creating a stream");
  try {
    clear_rank(r, s);
  } catch (...) {
    cudaStreamDestroy(s);
    throw;
  }
  cudaStreamDestroy(s);
}

void Workspace::quiesce() const {
  DeviceGuard guard;
  for (auto& g : groups_) {
    for (auto& r : g) {
      if (!r) continue;
      check_cuda(cudaSetDevice(r->ordinal), "selecting a device");
      check_cuda(cudaDeviceSynchronize(), "waiting for the device to go idle");
    }
  }
}

void Workspace::reset() {
  quiesce();
  DeviceGuard guard;
  for (auto& g : groups_) {
    for (auto& r : g) {
      if (!r) continue;
      clear_rank(*r);
    }
  }
}

std::vector<std::string> Workspace::ipc_handles() const {
  std::vector<std::string> out;
  DeviceGuard guard;
  exported_ = true;  // (set before any handle leaves: a partly exported workspace counts)
  for (const auto& g : groups_) {
    for (const auto& r : g) {
      if (!r) continue;
      check_cuda(cudaSetDevice(r->ordinal), "selecting a device");
      cudaIpcMemHandle_t h;
      check_cuda(cudaIpcGetMemHandle(&h, r->base), "exporting a CUDA IPC handle of " + where(*r));
      out.emplace_back(reinterpret_cast<const char*>(&h), sizeof(h));
    }
  }
  return out;
}

void Workspace::connect(const std::vector<std::vector<std::string>>& handles) {
  if (connected_) throw std::runtime_error("workspace already connected");
  DeviceGuard guard;
  const size_t n = static_cast<size_t>(group_size());
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    auto& g = groups_[gi];
    for (auto& rk : g) {
      if (!rk) continue;
      check_cuda(cudaSetDevice(rk->ordinal), "selecting a device");
      PeerTable table{};
      WorkspaceHeader header{};
      for (size_t p = 0; p < n; ++p) {
        if (g[p]) {
          table.base[p] = static_cast<char*>(g[p]->base);
        } else {
          if (gi >= handles.size() || p >= handles[gi].size() ||
              handles[gi][p].size() != sizeof(cudaIpcMemHandle_t)) {
            throw std::runtime_error("no CUDA IPC handle for group " + std::to_string(gi) +
                                     " rank " + std::to_string(p));
          }
          cudaIpcMemHandle_t h;
          std::memcpy(&h, handles[gi][p].data(), sizeof(h));
          void* ptr = nullptr;
          check_cuda(cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess),
                     "opening the CUDA IPC handle of group " + std::to_string(gi) + " rank " +
                         std::to_string(p) + " on " + where(*rk));
          opened_.push_back({rk->ordinal, ptr});
          table.base[p] = static_cast<char*>(ptr);
        }
        header.peer_bases[p] = table.base[p];
      }
      RankView& v = rk->view;
      v.header = rk->header;
      unsigned long long* dev_err = nullptr;
      check_cuda(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_err), rk->host_error, 0),
                 "mapping the host error word");
      v.host_error = dev_err;
      v.peers = table;
      v.geo = geo_;
      v.rank = rk->rank;
      v.nranks = static_cast<int>(n);
      v.max_blocks = max_blocks_;
      v.pdl = use_pdl(rk->ordinal, config_.pdl) ? 1 : 0;
      v.timeout_ns = config_.timeout_ms * 1000000ull;
      v.trap = config_.trap ? 1 : 0;
      v.signatures = config_.signatures ? 1 : 0;
      check_cuda(cudaMemcpy(&rk->header->peer_bases, header.peer_bases, sizeof(header.peer_bases),
                            cudaMemcpyHostToDevice),
                 "writing the header of " + where(*rk));
    }
  }
  connected_ = true;
}

Rank* Workspace::rank_for_ordinal(int ordinal) const {
  if (virtual_ranks_) return nullptr;
  for (const auto& g : groups_) {
    for (const auto& r : g) {
      if (r && r->ordinal == ordinal) return r.get();
    }
  }
  return nullptr;
}

std::vector<int> Workspace::local_ordinals() const {
  std::vector<int> out;
  for (const auto& g : groups_) {
    for (const auto& r : g) {
      if (r && std::find(out.begin(), out.end(), r->ordinal) == out.end()) out.push_back(r->ordinal);
    }
  }
  return out;
}

uint64_t Workspace::error_word(const Rank& r) const {
  return r.host_error ? *reinterpret_cast<volatile unsigned long long*>(r.host_error) : 0;
}

namespace {

// What a kRagged error's host record says (kernels/ragged.h), in words.
std::string describe_ragged(const DecodedError& d, uint64_t first, uint64_t second) {
  const auto problem = static_cast<RaggedProblem>(first >> 48);
  const std::string slice = std::to_string((first >> 32) & 0xFFFF);
  const int32_t a = static_cast<int32_t>(first & 0xFFFFFFFFu);
  const int32_t b = static_cast<int32_t>(second >> 32);
  const int32_t c = static_cast<int32_t>(second & 0xFFFFFFFFu);
  const std::string rank = "rank " + std::to_string(d.rank);
  const std::string peer = "rank " + std::to_string(d.peer);
  const std::string rows = [](int32_t from, int32_t count) {
    return "rows [" + std::to_string(from) + ", " + std::to_string(int64_t{from} + count) + ")";
  }(a, b);
  switch (problem) {
    case RaggedProblem::kSizes:
      return "ragged_all_to_all: " + rank + " expects " + std::to_string(a) + " rows in slice " +
             slice + " from " + peer + " (its recv_sizes) but " + peer + " sends " +
             std::to_string(b) + " (its send_sizes): send_sizes must equal jax.lax.all_to_all of "
             "recv_sizes.";
    case RaggedProblem::kInputRange:
      return "ragged_all_to_all: " + rank + "'s slice " + slice + " for " + peer + " reads " +
             rows + " of an operand of " + std::to_string(c) + " rows (input_offsets, send_sizes).";
    case RaggedProblem::kOutputRange:
      return "ragged_all_to_all: the slice " + slice + " that " + peer + " sends " + rank +
             " goes to " + rows + " of an output of " + std::to_string(c) +
             " rows (the sender's output_offsets, send_sizes).";
    case RaggedProblem::kPeerSlice:
      return "ragged_all_to_all: the slice " + slice + " that " + peer + " sends " + rank +
             " reads rows outside " + peer + "'s operand (" + peer + " records which).";
  }
  return "ragged_all_to_all: sizes or offsets out of range.";
}

}  // namespace

std::string Workspace::describe_error(const Rank& r, uint64_t word) const {
  const DecodedError d = decode_error(word);
  std::string msg = "jaxll: workspace " + std::to_string(id_) + ", " + where(r) + ": ";
  const volatile unsigned long long* rec = r.host_error;
  if (d.kind == ErrorKind::kMismatch) {
    msg += "rank " + std::to_string(d.rank) + " and rank " + std::to_string(d.peer) +
           " made different calls (block " + std::to_string(d.block) + ", epoch " +
           std::to_string(d.epoch) + "): rank " + std::to_string(d.rank) + " called " +
           describe_signature(rec ? rec[1] : 0) + "; rank " + std::to_string(d.peer) +
           " called " + describe_signature(rec ? rec[2] : 0) +
           ". Every rank of a group must make the same jaxll calls in the same order. The "
           "outputs of this call are poisoned (all-ones bits, NaN for floats), and so are "
           "those of every later call on this workspace until jaxll.reset() is called on "
           "every rank.";
  } else if (d.kind == ErrorKind::kTimeout || d.kind == ErrorKind::kNotStarted) {
    msg += "rank " + std::to_string(d.rank) + " waited more than " +
           std::to_string(config_.timeout_ms) + " ms for rank " + std::to_string(d.peer) +
           (d.kind == ErrorKind::kNotStarted ? " to start its call" : "") + " (block " +
           std::to_string(d.block) + ", epoch " + std::to_string(d.epoch) +
           ") and gave up. The ranks of this group are out of step: a rank did not run the "
           "same sequence of jaxll calls, or was not scheduled, or has died. Results of this "
           "and every later call on this workspace are poisoned (all-ones bits, NaN for "
           "floats) until jaxll.reset() is called on every rank.";
  } else if (d.kind == ErrorKind::kRagged) {
    msg += describe_ragged(d, rec ? rec[1] : 0, rec ? rec[2] : 0) +
           " The outputs of this call are poisoned (all-ones bits, NaN for floats), and so are "
           "those of every later call on this workspace until jaxll.reset() is called on every "
           "rank.";
  } else {
    char hex[32];
    std::snprintf(hex, sizeof(hex), "0x%016llx", static_cast<unsigned long long>(word));
    msg += std::string("unknown error word ") + hex;
  }
  return msg;
}

std::string Workspace::first_error() const {
  for (const auto& g : groups_) {
    for (const auto& r : g) {
      if (!r) continue;
      if (uint64_t word = error_word(*r)) return describe_error(*r, word);
    }
  }
  return "";
}

void Workspace::close_imports() {
  DeviceGuard guard;
  for (auto& g : groups_) {
    for (auto& r : g) {
      if (r) {
        cudaSetDevice(r->ordinal);
        cudaDeviceSynchronize();
      }
    }
  }
  for (const auto& [ordinal, ptr] : opened_) {
    cudaSetDevice(ordinal);
    cudaIpcCloseMemHandle(ptr);
  }
  opened_.clear();
  connected_ = false;
}

void Workspace::release(bool keep_exported) {
  DeviceGuard guard;
  close_imports();
  const bool keep = keep_exported && exported_;
  for (auto& g : groups_) {
    for (auto& r : g) {
      if (!r) continue;
      cudaSetDevice(r->ordinal);
      cudaDeviceSynchronize();
      if (r->header) {
        // The header stays (see take_header), marked freed.
        const unsigned long long freed = encode_error(ErrorKind::kFreed, r->rank, 0, 0, 0);
        cudaMemcpy(&r->header->error, &freed, sizeof(freed), cudaMemcpyHostToDevice);
      }
      if (r->base && !keep) cudaFree(r->base);  // (kept: left to the process's end)
      if (r->host_error) cudaFreeHost(r->host_error);
      r->base = nullptr;
      r->host_error = nullptr;
    }
  }
  groups_.clear();
  cudaGetLastError();
}

Workspace::~Workspace() { release(); }

}  // namespace jaxll
