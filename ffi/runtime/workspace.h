// Symmetric workspaces (jaxll.Workspace in Python) and the process-wide registry
// that owns them (the private bindings in module.cc: create_workspace,
// workspace_info, ...; the FFI attribute that carries the id is "workspace").
//
// A Workspace serves one set of device groups that reduce together (for a mesh axis,
// every group of that axis that has a device in this process). Each member device
// is one rank of its group and owns one allocation laid out as in
// jaxll/workspace_layout.h. Workspaces are built from Python at lowering time, never
// inside an XLA Execute, and live until freed explicitly or at exit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jaxll/rank_view.h"

namespace jaxll {

struct WorkspaceConfig {
  size_t scratch_bytes = 0;  // payload bytes per rank one one-shot round moves (all blocks)
  uint64_t timeout_ms = 0;   // deadline of every spin-wait
  // Ranks of several processes share a GPU of this workspace (CUDA MPS or time
  // slicing): programmatic dependent launch stays off there unless JAXLL_PDL=1.
  bool shared_gpu = false;
};

struct Rank {
  int group = 0;
  int rank = 0;
  int ordinal = 0;                          // CUDA device ordinal
  void* base = nullptr;                     // the rank's device allocation (scratch)
  WorkspaceHeader* header = nullptr;        // its header (from a pool, never freed)
  unsigned long long* host_error = nullptr;  // mapped pinned error record (kHostErrorWords)
  RankView view{};                          // what its kernels get
  cudaStream_t stream = nullptr;            // virtual ranks: the rank's own stream
  cudaEvent_t done = nullptr;               // virtual ranks: joins the rank back
};

class Workspace {
 public:
  // Builds the workspace: allocates and clears the memory of every rank in this
  // process, makes local peers reachable, loads every kernel on every local
  // device. Throws std::runtime_error with a readable message on failure
  // (nothing is left allocated). groups[g] lists the CUDA ordinals of group g in
  // rank order, -1 for a rank that lives in another process. With
  // `virtual_ranks`, there is one group and all its ranks are on one device.
  // Without remote ranks the workspace is ready; with them, `max_blocks_agreed`
  // (the grid bound every process agreed on) is required, and the workspace is
  // ready once connect() has mapped the other processes' memory.
  static std::unique_ptr<Workspace> Create(int id, const std::vector<std::vector<int>>& groups,
                                      bool virtual_ranks, const WorkspaceConfig& config,
                                      int max_blocks_agreed = 0);
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
  // The views of group `group`'s ranks, in rank order (every rank must be local:
  // a virtual-rank workspace's; for the group launches of all_reduce.h).
  std::vector<RankView> views(int group) const {
    std::vector<RankView> out;
    for (const auto& r : groups_[group]) out.push_back(r->view);
    return out;
  }
  // The rank a (non-virtual) workspace runs on CUDA device `ordinal`, or null.
  Rank* rank_for_ordinal(int ordinal) const;

  const ScratchGeometry& geometry() const { return geo_; }
  int max_blocks() const { return max_blocks_; }
  // Payload bytes per rank one round of a one-shot kernel moves (all blocks).
  size_t round_bytes() const { return static_cast<size_t>(geo_.blocks) * geo_.region_bytes; }
  size_t bytes_per_rank() const { return geo_.total_bytes; }
  cudaEvent_t fork_event() const { return fork_; }

  // Testing hook: waits for the workspace's devices to go idle, then sets every
  // block's epoch of every rank to `epoch`, as if that many rounds had run (every
  // LL16 slot carrying that epoch's flag). Lets tests cross the 32-bit flag wrap
  // and the LL16 refresh (every 2^30 epochs) without 2^30 calls.
  void set_epochs(uint64_t epoch);

  // Error word of a rank as last written by its kernels (0: none).
  uint64_t error_word(const Rank& r) const;
  // A sentence describing an error word of this workspace (with the signatures of a
  // mismatch from the rank's error record).
  std::string describe_error(const Rank& r, uint64_t word) const;

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
  // Writes the state of a new workspace into rank `r`'s memory (stream-ordered
  // on `s`) and clears its error record.
  void clear_rank(Rank& r, cudaStream_t s) const;

  int id_ = 0;
  bool virtual_ranks_ = false;
  WorkspaceConfig config_;
  std::vector<std::vector<std::unique_ptr<Rank>>> groups_;
  ScratchGeometry geo_;
  int max_blocks_ = 0;
  bool connected_ = false;
  std::vector<std::pair<int, void*>> opened_;  // (ordinal, pointer) of opened IPC handles
  mutable bool exported_ = false;               // ipc_handles() handed this memory out
  cudaEvent_t fork_ = nullptr;
};

// Kernels that every workspace built from now on loads on its devices along
// with jaxll's own (see load_all_kernels in workspace.cc): tools built on the
// runtime hand theirs in (the bindings register the testing kernels), so the
// runtime depends on no tool.
void register_preloaded_kernels(const std::vector<const void*>& fns);
// An extension's kernel loader (ExtensionApi::register_loader, jaxll/extension.h).
using KernelLoader = int (*)(int ordinal, int carveout, char* error, size_t error_len);
// Runs `load` now on the devices of this process's ranks of every workspace built
// so far, then keeps it: every workspace built from now on runs it on each of its
// devices, after loading jaxll's kernels there. Throws std::runtime_error with the
// loader's message (and keeps nothing) if a run fails.
void register_kernel_loader(KernelLoader load);

// SMs times the lowest occupancy of jaxll's kernels on CUDA device `ordinal`
// (loads every kernel there; `group_twins`: the group twins too, as virtual-rank
// workspaces do): the most blocks that can be co-resident.
int device_block_bound(int ordinal, bool group_twins = false);
// The device's UUID as 32 hex digits (tells processes that share a GPU apart).
std::string device_uuid(int ordinal);

// The registry. Lookups (WorkspaceRef) are lock-free (safe from XLA's
// execution threads); create and free take a lock. Ids are never reused
// within a process.
int workspace_create(const std::vector<std::vector<int>>& groups, bool virtual_ranks,
                const WorkspaceConfig& config, int max_blocks_agreed = 0);
// A hold on workspace `id` for as long as it lives: get() is the workspace, or
// null where there is none (never made, or freed). workspace_free waits until
// every hold that found the workspace is gone, so what a hold found stays
// valid while it lives, and a hold taken once the free has begun finds none.
// Every use of a looked-up workspace (an FFI handler's launch, a binding's
// operation) keeps one for its duration; two atomic operations a hold. A hold
// must not call workspace_free on its own id (it would wait for itself).
class WorkspaceRef {
 public:
  explicit WorkspaceRef(int64_t id);
  ~WorkspaceRef();
  WorkspaceRef(WorkspaceRef&& o) noexcept : id_(o.id_), c_(o.c_) {
    o.id_ = 0;
    o.c_ = nullptr;
  }
  WorkspaceRef(const WorkspaceRef&) = delete;
  WorkspaceRef& operator=(const WorkspaceRef&) = delete;
  WorkspaceRef& operator=(WorkspaceRef&&) = delete;
  Workspace* get() const { return c_; }
  Workspace& operator*() const { return *c_; }
  Workspace* operator->() const { return c_; }

 private:
  int64_t id_ = 0;  // (0: holds nothing)
  Workspace* c_ = nullptr;
};
// Takes the workspace out of the registry (later holds find none), waits for
// the holds that found it, then for its devices to go idle, then frees it
// (with `keep_exported`, keeps the memory other processes were handed, see
// Workspace::release). False if unknown.
bool workspace_free(int64_t id, bool keep_exported = false);
void workspace_free_all(bool keep_exported = false);
std::vector<int> workspace_ids();

// JAXLL_ON_ERROR: "poison" (default) or "trap" (see spin_wait.cuh); throws on
// any other value.
bool trap_on_error();
// JAXLL_SIGNATURES: "1" (default) checks every call's signature against the
// peers' (jaxll/round.cuh), "0" does not (a mismatch then goes unnoticed
// or surfaces as a timeout); throws on any other value.
bool check_signatures();

// Throws std::runtime_error("<what>: <CUDA error>") if `err` is not cudaSuccess.
void check_cuda(cudaError_t err, const std::string& what);

// Makes `device` current (if >= 0) and restores the caller's device on scope exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device = -1) {
    has_prev_ = cudaGetDevice(&prev_) == cudaSuccess;
    if (device >= 0) check_cuda(cudaSetDevice(device), "selecting CUDA device " + std::to_string(device));
  }
  ~DeviceGuard() {
    if (has_prev_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool has_prev_ = false;
};

}  // namespace jaxll
