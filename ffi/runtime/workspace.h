// A symmetric workspace: the memory the ranks of one set of device groups
// reduce through (jaxll.Workspace in Python; the registry that owns them is
// registry.h).
//
// A Workspace serves every group of one mesh axis that has a device in this
// process (or N virtual ranks on one GPU). Each member device is one rank of its
// group and owns one allocation laid out as in jaxll/workspace_layout.h.
// Workspaces are built from Python at lowering time, never inside an XLA
// Execute, and live until freed explicitly or at exit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jaxll/rank_view.h"
#include "kernels/cuda_call.h"
#include "runtime/config.h"

namespace jaxll {

struct Rank {
  int group = 0;
  int rank = 0;
  int ordinal = 0;                           // CUDA device ordinal
  void* base = nullptr;                      // the rank's device allocation (scratch)
  WorkspaceHeader* header = nullptr;         // its header (from a pool, never freed)
  unsigned long long* host_error = nullptr;  // mapped pinned error record (kHostErrorWords)
  RankView view{};                           // what its kernels get
};

class Workspace {
 public:
  // Builds the workspace (workspace_build.cc): allocates and clears the memory
  // of every rank in this process, makes local peers reachable, loads every
  // kernel on every local device. Throws std::runtime_error with a readable
  // message on failure (nothing is left allocated). groups[g] lists the CUDA
  // ordinals of group g in rank order, -1 for a rank that lives in another
  // process. With `virtual_ranks`, there is one group and all its ranks are on
  // one device. `max_blocks` > 0 bounds the grid further (the bound every
  // process agreed on, required with remote ranks; a tool's own kernels'
  // bound). Without remote ranks the workspace is ready; with them, once
  // connect() has mapped the other processes' memory.
  static std::unique_ptr<Workspace> Create(int id, const std::vector<std::vector<int>>& groups,
                                           bool virtual_ranks, const WorkspaceConfig& config,
                                           int max_blocks = 0);
  // CUDA IPC handles (64 bytes each) of the local ranks' memory, in (group, rank) order.
  std::vector<std::string> ipc_handles() const;
  // Opens the other processes' handles (handles[g][r], empty for local ranks)
  // and fills every local rank's peer table.
  void connect(const std::vector<std::vector<std::string>>& handles);
  bool connected() const { return connected_; }
  bool has_rank(int group, int r) const { return groups_[group][r] != nullptr; }
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  int id() const { return id_; }
  bool virtual_ranks() const { return virtual_ranks_; }
  const WorkspaceConfig& config() const { return config_; }
  int group_count() const { return static_cast<int>(groups_.size()); }
  int group_size() const { return groups_.empty() ? 0 : static_cast<int>(groups_[0].size()); }
  Rank& rank(int group, int r) const { return *groups_[group][r]; }
  // The rank a (non-virtual) workspace runs on CUDA device `ordinal`, or null.
  Rank* rank_for_ordinal(int ordinal) const;
  // The CUDA ordinals of this process's ranks, each once.
  std::vector<int> local_ordinals() const;

  const ScratchGeometry& geometry() const { return geo_; }
  int max_blocks() const { return max_blocks_; }
  // Payload bytes per rank one round of a one-shot kernel moves (all blocks).
  size_t round_bytes() const { return static_cast<size_t>(geo_.blocks) * geo_.region_bytes; }
  size_t bytes_per_rank() const { return geo_.total_bytes; }

  // Error word of a rank as last written by its kernels (0: none).
  uint64_t error_word(const Rank& r) const;
  // A sentence describing an error word of this workspace (with the signatures of a
  // mismatch from the rank's error record).
  std::string describe_error(const Rank& r, uint64_t word) const;
  // The first error any local rank recorded (its sentence), or "".
  std::string first_error() const;

  // Recovery: waits for this process's ranks to go idle (a kernel still waiting
  // for a peer gives up within the timeout), then puts every local rank's
  // memory, epochs and error record back to the state of a new workspace. Peer
  // pointers and the id stay, so compiled programs keep working. Every rank of
  // every group must be reset before any of them runs a call again (for
  // workspaces spanning processes, jaxll/workspace.py brackets this with
  // barriers through the distributed key-value store).
  void reset();
  // Waits for this process's ranks of the workspace to go idle (the first half of reset()).
  void quiesce() const;
  // Waits for this process's ranks to go idle, then unmaps the memory of other
  // processes' ranks that connect() opened; the workspace must run no call
  // after this (its peer tables point there). The first step of freeing a
  // workspace that spans processes: no process frees memory a peer may still
  // map (CUDA leaves that undefined) until every process has closed its imports.
  void close_imports();
  // Frees everything (also what the destructor does); with `keep_exported`,
  // the memory of ranks whose IPC handles left the process stays allocated
  // until the process ends (another process may still map it).
  void release(bool keep_exported = false);

 private:
  Workspace() = default;
  // Allocates and clears rank `r` of group `g` on `ordinal` (workspace_build.cc).
  std::unique_ptr<Rank> make_rank(int g, int r, int ordinal);
  // Writes the state of a new workspace into rank `r`'s memory (stream-ordered
  // on `s`) and clears its error record.
  void clear_rank(Rank& r, cudaStream_t s) const;
  // clear_rank on a stream of its own.
  void clear_rank(Rank& r) const;

  int id_ = 0;
  bool virtual_ranks_ = false;
  WorkspaceConfig config_;
  std::vector<std::vector<std::unique_ptr<Rank>>> groups_;
  ScratchGeometry geo_;
  int max_blocks_ = 0;
  bool connected_ = false;
  std::vector<std::pair<int, void*>> opened_;  // (ordinal, pointer) of opened IPC handles
  mutable bool exported_ = false;               // ipc_handles() handed this memory out
};

}  // namespace jaxll
