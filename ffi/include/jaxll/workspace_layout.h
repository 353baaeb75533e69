// Layout of one rank's symmetric workspace allocation, shared by host and device code.
//
// Every rank of a group allocates one block of device memory with the same layout:
//
//   offset 0                 WorkspaceHeader: error word, per-block epochs, peer table
//   offset kScratchOffset    LL scratch: [block][parity][source rank][slot] of LL16 packets
//
// Peers only ever write into the LL scratch of another rank; the header is private to
// its owner (the peer table in it is a copy kept for users' own kernels).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define JAXLL_HOST_DEVICE __host__ __device__
#else
#define JAXLL_HOST_DEVICE
#endif

namespace jaxll {

// Largest group one workspace serves (one NVLink domain of today's hosts, with room).
constexpr int kMaxRanks = 16;
// Largest grid of any jaxll kernel; one epoch counter per block index.
constexpr int kMaxBlocks = 64;
// Threads per block of the collective kernels.
constexpr int kBlockThreads = 512;
// Bytes of payload one LL16 packet carries.
constexpr int kLLPayloadBytes = 8;
// Bytes one LL16 packet occupies.
constexpr int kLLPacketBytes = 16;

struct WorkspaceHeader {
  // Nonzero once a kernel of this rank gave up waiting (see error_word.h).
  unsigned long long error;
  uint32_t reserved[30];
  // Epoch of each block index: the number of calls that block index has served.
  // Only ever incremented, by the kernels themselves; wraps modulo 2^32.
  uint32_t epochs[kMaxBlocks];
  // Base address (as seen from this rank's device) of every rank's workspace.
  void* peer_bases[kMaxRanks];
};

constexpr size_t kScratchOffset = 4096;
static_assert(sizeof(WorkspaceHeader) <= kScratchOffset, "header too large");

// Index of packet `slot` of the LL scratch region that block `block` uses at
// epoch parity `parity` for data coming from rank `src`.
JAXLL_HOST_DEVICE inline size_t ll_slot_index(int block, int parity, int src, int nranks,
                                                uint32_t slots_per_block, size_t slot) {
  return ((static_cast<size_t>(block) * 2 + parity) * nranks + src) * slots_per_block + slot;
}

// Bytes of LL scratch per rank for a group of `nranks` with `slots_per_block` packets
// per (block, parity, source) region and `blocks` block indices.
inline size_t ll_scratch_bytes(int nranks, uint32_t slots_per_block, int blocks) {
  return static_cast<size_t>(blocks) * 2 * nranks * slots_per_block * kLLPacketBytes;
}

}  // namespace jaxll
