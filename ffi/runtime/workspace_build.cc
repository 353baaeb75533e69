// Building a workspace: checking its groups, making peers reachable, loading
// the kernels, bounding the grid, allocating and clearing every local rank.
#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "jaxll/workspace_layout.h"
#include "runtime/kernel_loading.h"
#include "runtime/workspace.h"

namespace jaxll {
namespace {

// Headers come from chunks that are never freed: a freed workspace leaves its
// headers behind, marked ErrorKind::kFreed, so that a command buffer recorded
// against it and replayed later reads a live header, sees the mark, poisons its
// output and touches no freed memory. kHeaderSlot bytes per rank and workspace.
constexpr size_t kHeaderSlot = 16384;
constexpr size_t kHeadersPerChunk = 256;
static_assert(sizeof(WorkspaceHeader) <= kHeaderSlot, "header too large for its slot");

WorkspaceHeader* take_header(int ordinal) {
  static std::mutex mu;
  static std::vector<std::pair<char*, size_t>> chunks(64, {nullptr, kHeadersPerChunk});
  std::lock_guard<std::mutex> lock(mu);
  if (ordinal < 0 || ordinal >= static_cast<int>(chunks.size())) {
    throw std::runtime_error("CUDA device ordinal " + std::to_string(ordinal) + " out of range");
  }
  auto& [chunk, used] = chunks[ordinal];
  if (used == kHeadersPerChunk) {
    DeviceGuard guard(ordinal);
    check_cuda(cudaMalloc(&chunk, kHeaderSlot * kHeadersPerChunk), "allocating workspace headers");
    used = 0;
  }
  return reinterpret_cast<WorkspaceHeader*>(chunk + kHeaderSlot * used++);
}

bool has_remote_ranks(const std::vector<std::vector<int>>& groups) {
  for (const auto& g : groups)
    for (int o : g)
      if (o < 0) return true;
  return false;
}

// Throws where the groups cannot make a workspace.
void check_groups(const std::vector<std::vector<int>>& groups, bool virtual_ranks,
                  const WorkspaceConfig& config, int max_blocks) {
  if (groups.empty()) throw std::runtime_error("a workspace needs at least one group");
  const size_t n = groups[0].size();
  for (const auto& g : groups) {
    if (g.size() != n) throw std::runtime_error("all groups of a workspace must have one size");
  }
  if (n < 1 || n > static_cast<size_t>(kMaxRanks)) {
    throw std::runtime_error("group size " + std::to_string(n) + " is outside 1.." +
                             std::to_string(kMaxRanks));
  }
  if (config.scratch_bytes < static_cast<size_t>(kLLPayloadBytes)) {
    throw std::runtime_error("scratch_bytes must be at least 8");
  }
  if (virtual_ranks) {
    if (groups.size() != 1) throw std::runtime_error("virtual ranks take exactly one group");
    for (int o : groups[0]) {
      if (o != groups[0][0]) throw std::runtime_error("virtual ranks must share one device");
    }
  } else {
    std::vector<int> all;
    for (const auto& g : groups)
      for (int o : g)
        if (o >= 0) all.push_back(o);
    std::sort(all.begin(), all.end());
    if (std::adjacent_find(all.begin(), all.end()) != all.end()) {
      throw std::runtime_error("a device appears twice in the groups of one workspace");
    }
  }
  if (has_remote_ranks(groups) && max_blocks <= 0) {
    throw std::runtime_error("a workspace with ranks in other processes needs the grid bound "
                             "agreed by every process");
  }
  int device_count = 0;
  check_cuda(cudaGetDeviceCount(&device_count), "counting CUDA devices");
  for (const auto& g : groups) {
    for (int o : g) {
      if (o >= device_count || (o < 0 && virtual_ranks)) {
        throw std::runtime_error("CUDA device " + std::to_string(o) + " does not exist (" +
                                 std::to_string(device_count) + " visible)");
      }
    }
  }
}

// Peer access between the members of each group that live in this process.
void enable_peer_access(const std::vector<std::vector<int>>& groups) {
  DeviceGuard guard;
  for (const auto& g : groups) {
    for (int a : g) {
      for (int b : g) {
        if (a == b || a < 0 || b < 0) continue;
        int ok = 0;
        check_cuda(cudaDeviceCanAccessPeer(&ok, a, b), "querying peer access");
        if (!ok) {
          throw std::runtime_error("CUDA device " + std::to_string(a) +
                                   " cannot access the memory of device " + std::to_string(b));
        }
        check_cuda(cudaSetDevice(a), "selecting a device");
        cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) {
          cudaGetLastError();
        } else {
          check_cuda(e, "enabling peer access");
        }
      }
    }
  }
}

// Loads every kernel on every local device and bounds the grid so that all
// blocks of all ranks sharing a device are co-resident; `max_blocks` > 0 (an
// agreed or a tool's bound) bounds it further.
int grid_bound(const std::vector<std::vector<int>>& groups, bool virtual_ranks, int carveout,
               int max_blocks) {
  const int ranks_per_device = virtual_ranks ? static_cast<int>(groups[0].size()) : 1;
  int bound = kMaxBlocks;
  std::vector<int> seen;
  for (const auto& g : groups) {
    for (int o : g) {
      if (o < 0 || std::find(seen.begin(), seen.end(), o) != seen.end()) continue;
      seen.push_back(o);
      bound = std::min(bound, device_block_bound(o, carveout) / ranks_per_device);
    }
  }
  if (max_blocks > 0) bound = std::min(bound, max_blocks);
  if (bound < 1) {
    throw std::runtime_error("the device cannot hold one block per rank for " +
                             std::to_string(groups[0].size()) + " ranks");
  }
  return bound;
}

}  // namespace

std::unique_ptr<Rank> Workspace::make_rank(int g, int r, int ordinal) {
  auto rk = std::make_unique<Rank>();
  rk->group = g;
  rk->rank = r;
  rk->ordinal = ordinal;
  DeviceGuard guard(ordinal);
  check_cuda(cudaMalloc(&rk->base, bytes_per_rank()),
             "allocating " + std::to_string(bytes_per_rank()) + " bytes of workspace on group " +
                 std::to_string(g) + " rank " + std::to_string(r) + " (CUDA device " +
                 std::to_string(ordinal) + ")");
  rk->header = take_header(ordinal);
  check_cuda(cudaHostAlloc(reinterpret_cast<void**>(&rk->host_error),
                           kHostErrorWords * sizeof(unsigned long long),
                           cudaHostAllocMapped | cudaHostAllocPortable),
             "allocating the host error record");
  return rk;
}

std::unique_ptr<Workspace> Workspace::Create(int id, const std::vector<std::vector<int>>& groups,
                                             bool virtual_ranks, const WorkspaceConfig& config,
                                             int max_blocks) {
  check_groups(groups, virtual_ranks, config, max_blocks);
  const size_t n = groups[0].size();
  std::unique_ptr<Workspace> c(new Workspace());
  c->id_ = id;
  c->virtual_ranks_ = virtual_ranks;
  c->config_ = config;
  try {
    if (!virtual_ranks) enable_peer_access(groups);
    c->max_blocks_ = grid_bound(groups, virtual_ranks, config.carveout, max_blocks);
    const size_t region = (config.scratch_bytes + c->max_blocks_ - 1) / c->max_blocks_;
    if (region > 0x7FFFFFFFull) throw std::runtime_error("scratch_bytes is too large");
    c->geo_ = make_geometry(static_cast<int>(n), c->max_blocks_, region);
    // Every local rank's memory, cleared before any handle to it leaves the process.
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      c->groups_.emplace_back();
      for (size_t r = 0; r < n; ++r) {
        const int ordinal = groups[gi][r];
        if (ordinal < 0) {
          c->groups_.back().push_back(nullptr);
          continue;
        }
        c->groups_.back().push_back(c->make_rank(static_cast<int>(gi), static_cast<int>(r), ordinal));
        c->clear_rank(*c->groups_.back().back());
      }
    }
    if (!has_remote_ranks(groups)) c->connect({});
  } catch (...) {
    c->release();
    throw;
  }
  return c;
}

}  // namespace jaxll
