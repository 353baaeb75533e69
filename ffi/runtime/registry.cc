#include "runtime/registry.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

namespace jaxll {
namespace {

constexpr int kMaxWorkspaces = 4096;
std::atomic<Workspace*> g_workspaces[kMaxWorkspaces];
std::atomic<int> g_holds[kMaxWorkspaces];  // live WorkspaceRefs that found workspace id
std::mutex g_mu;
int g_next_id = 1;

}  // namespace

int workspace_create(const std::vector<std::vector<int>>& groups, bool virtual_ranks,
                     const WorkspaceConfig& config, int max_blocks) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_next_id >= kMaxWorkspaces) throw std::runtime_error("too many jaxll workspaces created");
  const int id = g_next_id;
  std::unique_ptr<Workspace> c = Workspace::Create(id, groups, virtual_ranks, config, max_blocks);
  ++g_next_id;
  g_workspaces[id].store(c.release(), std::memory_order_release);
  return id;
}

// (sequentially consistent, with the exchange in workspace_free: a hold that
// found the workspace counted before the exchange, so the free sees it)
WorkspaceRef::WorkspaceRef(int64_t id) {
  if (id <= 0 || id >= kMaxWorkspaces) return;
  g_holds[id].fetch_add(1, std::memory_order_seq_cst);
  c_ = g_workspaces[id].load(std::memory_order_seq_cst);
  if (c_ != nullptr) {
    id_ = id;
  } else {
    g_holds[id].fetch_sub(1, std::memory_order_seq_cst);
  }
}

WorkspaceRef::~WorkspaceRef() {
  if (id_ > 0) g_holds[id_].fetch_sub(1, std::memory_order_seq_cst);
}

bool workspace_free(int64_t id, bool keep_exported) {
  if (id <= 0 || id >= kMaxWorkspaces) return false;
  Workspace* c = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    c = g_workspaces[id].exchange(nullptr, std::memory_order_seq_cst);
  }
  if (c == nullptr) return false;
  // (holds are short: a handler's launch, a binding's operation, whose waits
  // on the devices are bounded by the workspace's timeout)
  while (g_holds[id].load(std::memory_order_seq_cst) != 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  c->release(keep_exported);
  delete c;
  return true;
}

void workspace_free_all(bool keep_exported) {
  for (int id : workspace_ids()) workspace_free(id, keep_exported);
}

std::vector<int> workspace_ids() {
  std::vector<int> ids;
  std::lock_guard<std::mutex> lock(g_mu);
  for (int i = 1; i < g_next_id; ++i) {
    if (g_workspaces[i].load(std::memory_order_acquire)) ids.push_back(i);
  }
  return ids;
}

void register_kernel_loader(KernelLoader load) {
  std::vector<std::pair<int, int>> devices;  // (ordinal, carveout) of the workspaces built so far
  {
    std::lock_guard<std::mutex> lock(g_mu);  // (no workspace is freed meanwhile)
    for (int i = 1; i < g_next_id; ++i) {
      const Workspace* c = g_workspaces[i].load(std::memory_order_acquire);
      if (c == nullptr) continue;
      for (int o : c->local_ordinals()) devices.emplace_back(o, c->config().carveout);
    }
  }
  for (const auto& [ordinal, carveout] : devices) run_loader(load, ordinal, carveout);  // (throws: not kept)
  keep_loader(load);
}

}  // namespace jaxll
