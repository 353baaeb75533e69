// A virtual-rank workspace as the testing tools hold it: the runtime's workspace
// (N ranks on one GPU), reached only through the extension API
// (jaxll/extension.h), and a CUDA stream per rank that the tools own.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "jaxll/extension.h"
#include "kernels/status.h"

namespace jaxll {

struct VirtualRank {
  RankView view{};
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;  // joins the rank back into a caller's stream
};

class VirtualGroup {
 public:
  // Creates the ranks' streams and events on CUDA device `ordinal`.
  VirtualGroup(int64_t workspace, int ordinal, int nranks);
  ~VirtualGroup();
  VirtualGroup(const VirtualGroup&) = delete;
  VirtualGroup& operator=(const VirtualGroup&) = delete;

  int64_t workspace() const { return workspace_; }
  int ordinal() const { return ordinal_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  VirtualRank& rank(int r) { return ranks_[r]; }
  cudaEvent_t fork_event() const { return fork_; }
  std::vector<RankView> views() const;

  // Fetches every rank's view from the runtime and returns the first error its
  // kernels recorded ("" if none). Throws std::runtime_error where the
  // workspace is gone or is not a virtual workspace of `size()` ranks.
  std::string refresh();
  // Waits for every rank's stream.
  void sync() const;

 private:
  void release();

  int64_t workspace_;
  int ordinal_;
  std::vector<VirtualRank> ranks_;
  cudaEvent_t fork_ = nullptr;
};

// The extension API table of the jaxll runtime (the module's init sets it).
void set_extension_api(const ExtensionApi* api);
const ExtensionApi* extension_api();

// The tools' group of virtual-rank workspace `workspace` (N ranks on CUDA
// device `ordinal`), made on first use: the ranks' streams are created here,
// never inside an XLA Execute (Python attaches a workspace as it builds it).
// Groups of workspaces the runtime no longer has are dropped here.
VirtualGroup& attach_group(int64_t workspace, int ordinal, int nranks);
// The group attached for `workspace`, or null (FFI handlers look groups up).
VirtualGroup* find_group(int64_t workspace);

// Throws std::runtime_error naming `what` where `s` is not ok.
void check_status(const Status& s, const std::string& what);

}  // namespace jaxll
