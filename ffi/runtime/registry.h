// The process-wide registry of workspaces (the bindings' create_workspace,
// free_workspace, ...; the FFI attribute that carries an id is "workspace").
// Lookups (WorkspaceRef) are lock-free, safe from XLA's execution threads;
// create and free take a lock. Ids are never reused within a process.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/kernel_loading.h"
#include "runtime/workspace.h"

namespace jaxll {

// Builds a workspace (Workspace::Create) and registers it; returns its id.
int workspace_create(const std::vector<std::vector<int>>& groups, bool virtual_ranks,
                     const WorkspaceConfig& config, int max_blocks = 0);

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

// Runs `load` now on the devices of this process's ranks of every workspace
// built so far (with each one's carveout), then keeps it: every workspace built
// from now on runs it on each of its devices, after loading jaxll's kernels
// there. Throws std::runtime_error with the loader's message (and keeps
// nothing) if a run fails.
void register_kernel_loader(KernelLoader load);

}  // namespace jaxll
