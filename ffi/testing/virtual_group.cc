#include "testing/virtual_group.h"

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "kernels/cuda_call.h"

namespace jaxll {
namespace {

const ExtensionApi* g_api = nullptr;
std::mutex g_mu;
std::map<int64_t, std::unique_ptr<VirtualGroup>>& groups() {
  static std::map<int64_t, std::unique_ptr<VirtualGroup>> all;
  return all;
}

// Whether the runtime still has workspace `id`.
bool workspace_exists(int64_t id) {
  RankView view;
  char error[256];
  return extension_api()->get_rank_view_of(id, 0, 0, &view, error, sizeof(error)) !=
         kExtensionNoWorkspace;
}

}  // namespace

void set_extension_api(const ExtensionApi* api) { g_api = api; }

const ExtensionApi* extension_api() {
  if (g_api == nullptr) throw std::runtime_error("jaxll's testing module was not initialised");
  return g_api;
}

VirtualGroup::VirtualGroup(int64_t workspace, int ordinal, int nranks)
    : workspace_(workspace), ordinal_(ordinal), ranks_(nranks) {
  DeviceGuard guard(ordinal);
  try {
    for (VirtualRank& r : ranks_) {
      check_cuda(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking),
                 "creating a virtual rank's stream");
      check_cuda(cudaEventCreateWithFlags(&r.done, cudaEventDisableTiming), "creating an event");
    }
    check_cuda(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), "creating an event");
  } catch (...) {
    release();
    throw;
  }
}

VirtualGroup::~VirtualGroup() { release(); }

void VirtualGroup::release() {
  DeviceGuard guard(ordinal_);
  for (VirtualRank& r : ranks_) {
    if (r.stream) {
      cudaStreamSynchronize(r.stream);
      cudaStreamDestroy(r.stream);
    }
    if (r.done) cudaEventDestroy(r.done);
    r.stream = nullptr;
    r.done = nullptr;
  }
  if (fork_) cudaEventDestroy(fork_);
  fork_ = nullptr;
}

std::vector<RankView> VirtualGroup::views() const {
  std::vector<RankView> out;
  for (const VirtualRank& r : ranks_) out.push_back(r.view);
  return out;
}

std::string VirtualGroup::refresh() {
  std::string first;
  for (int r = 0; r < size(); ++r) {
    char error[1024] = {0};
    const int rc = extension_api()->get_rank_view_of(workspace_, 0, r, &ranks_[r].view, error,
                                                    sizeof(error));
    if (rc == kExtensionHasError) {
      if (first.empty()) first = error;
    } else if (rc != kExtensionOk) {
      throw std::runtime_error(error);
    }
    if (ranks_[r].view.nranks != size()) {
      throw std::runtime_error("jaxll: workspace " + std::to_string(workspace_) +
                               " is not a virtual workspace of " + std::to_string(size()) +
                               " ranks");
    }
  }
  return first;
}

void VirtualGroup::sync() const {
  for (const VirtualRank& r : ranks_) {
    check_cuda(cudaStreamSynchronize(r.stream), "waiting for a virtual rank");
  }
}

VirtualGroup& attach_group(int64_t workspace, int ordinal, int nranks) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& all = groups();
  for (auto it = all.begin(); it != all.end();) {
    it = it->first != workspace && !workspace_exists(it->first) ? all.erase(it) : std::next(it);
  }
  auto found = all.find(workspace);
  if (found == all.end()) {
    found = all.emplace(workspace, std::make_unique<VirtualGroup>(workspace, ordinal, nranks)).first;
  }
  VirtualGroup& g = *found->second;
  if (g.ordinal() != ordinal || g.size() != nranks) {
    throw std::runtime_error("jaxll: virtual workspace " + std::to_string(workspace) +
                             " was attached with another device or rank count");
  }
  return g;
}

VirtualGroup* find_group(int64_t workspace) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto found = groups().find(workspace);
  return found == groups().end() ? nullptr : found->second.get();
}

void check_status(const Status& s, const std::string& what) {
  if (!s.ok()) throw std::runtime_error(what + ": " + s.describe());
}

}  // namespace jaxll
