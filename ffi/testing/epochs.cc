#include <cstdint>
#include <vector>

#include "jaxll/workspace_layout.h"
#include "kernels/cuda_call.h"
#include "testing/virtual_drivers.h"

namespace jaxll {

void set_epochs(VirtualGroup& g, uint64_t epoch) {
  g.refresh();
  DeviceGuard guard(g.ordinal());
  check_cuda(cudaDeviceSynchronize(), "waiting for the device");
  WorkspaceHeader h{};
  for (int b = 0; b < kMaxBlocks; ++b) h.epochs[b] = epoch;
  // Scratch as that history would have left it: every LL16 slot carries the
  // last epoch's flag, every barrier flag the last barrier's value.
  const ScratchGeometry& geo = g.rank(0).view.geo;
  const size_t ll_words = (geo.sentinel_offset - geo.ll_offset) / 4;
  std::vector<uint32_t> ll(ll_words, 0u);
  for (size_t i = 1; i < ll_words; i += 2) ll[i] = static_cast<uint32_t>(epoch);
  std::vector<uint32_t> flags(kMaxBlocks * kMaxRanks, static_cast<uint32_t>(epoch * 4 + 3));
  for (int r = 0; r < g.size(); ++r) {
    const RankView& v = g.rank(r).view;
    char* base = v.peers.base[v.rank];
    check_cuda(cudaMemcpy(v.header->epochs, h.epochs, sizeof(h.epochs), cudaMemcpyHostToDevice),
               "setting epochs");
    check_cuda(cudaMemcpy(base + geo.ll_offset, ll.data(), ll_words * 4, cudaMemcpyHostToDevice),
               "setting LL16 flags");
    check_cuda(cudaMemcpy(base + geo.flags_offset, flags.data(), flags.size() * 4,
                          cudaMemcpyHostToDevice),
               "setting barrier flags");
  }
}

}  // namespace jaxll
