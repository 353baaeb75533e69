// Layout of one rank's symmetric workspace allocation, shared by host and device code.
//
// Every rank of a group allocates one block of device memory with the same layout:
//
//   offset 0               unused (the WorkspaceHeader lives in an allocation of its own)
//   flags_offset           barrier flags [block][source rank] (barrier baselines only)
//   sig_offset             call signatures: one LL16 slot per [block][call parity][source]
//   ll_offset              LL16 scratch     [phase][block][parity][source] regions
//   sentinel_offset        sentinel scratch [phase][block][parity][source] regions
//   plain_offset           plain scratch    [phase][block][source] regions (barrier baselines)
//   atomic_offset          LL128-atomic lines [block][parity] regions (zero when idle)
//
// A region carries `region_bytes` bytes of payload for one round of one block
// (LL16 regions take twice that memory). Phase 0 receives a one-shot push or a
// two-shot reduce-scatter, phase 1 a two-shot all-gather. Peers write only into
// the scratch areas, signature slots and flags of another rank.
//
// The WorkspaceHeader (error word, per-block epochs) is private to its rank and
// sits in a small allocation of its own that outlives the workspace: a command
// buffer XLA recorded against a workspace and replays after it was freed reads
// the header, finds ErrorKind::kFreed, poisons its output and touches nothing
// else (see workspace.cc).
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
// Blocks of kBlockThreads every collective kernel fits on one multiprocessor
// (its register budget: 64 per thread on 64K-register SMs), which bounds how
// many ranks' grids can share one GPU.
constexpr int kMinBlocksPerSM = 2;
// Bytes of payload one LL16 packet carries.
constexpr int kLLPayloadBytes = 8;
// Bytes one LL16 packet occupies.
constexpr int kLLPacketBytes = 16;
// Bytes of one LL128-atomic line (one element of it is the arrival counter).
constexpr int kLineBytes = 128;
// Every byte of sentinel scratch holds this when idle (see sentinel.cuh).
constexpr unsigned char kSentinelByte = 0xFF;
// Scratch phases: 0 = one-shot push / reduce-scatter, 1 = all-gather.
constexpr int kPhases = 2;
// A block rewrites the LL16 slots it sends to once per this many epochs
// (see ll_packet.cuh), so no 32-bit flag ever ages into aliasing.
constexpr uint64_t kLLRefreshEpochs = 1ull << 30;
// 32-bit words of a fused call's partial sum of squares: a block's node of the
// row's tree of squares, a float (kernels/square_tree.cuh).
constexpr int kNormPartialWords = 1;


struct WorkspaceHeader {
  // Nonzero once a kernel of this rank gave up (see error_word.h).
  unsigned long long error;
  // Row-norm exchange of the fused all-reduce + RMSNorm kernel (blocks of one
  // rank that share a row combine their partial sums of squares): the tag of
  // its last row-wave so far, and how many blocks of the running call are done.
  uint64_t norm_tag;
  unsigned long long norm_done;
  uint64_t reserved[13];
  // Epoch of each block index: the number of rounds that block index has served,
  // over every call and algorithm. Only ever incremented, by the kernels themselves.
  uint64_t epochs[kMaxBlocks];
  // Calls each block index has served (modulo 2^32). Its parity picks the
  // signature slot a call uses (round.cuh, "Call signatures").
  uint32_t calls[kMaxBlocks];
  // Each block's partial sum of squares for the row it holds, by row-wave
  // parity: kNormPartialWords LL16 packets (payload: the node's bits and the
  // tag's high half; flag: the tag's low half), read by the
  // other blocks of the same row.
  alignas(16) uint64_t norm_partials[kMaxBlocks][2][kNormPartialWords][2];
  // Base address (as seen from this rank's device) of every rank's workspace.
  void* peer_bases[kMaxRanks];
};

constexpr size_t kHeaderBytes = 16384;
static_assert(sizeof(WorkspaceHeader) <= kHeaderBytes, "header too large");
static_assert(offsetof(WorkspaceHeader, norm_partials) % 16 == 0,
              "LL16 packets need 16-byte alignment");

// Words of a rank's host-visible error record (mapped pinned memory): the error
// word, then for a mismatch this rank's call signature and the peer's.
constexpr int kHostErrorWords = 4;

// Where each scratch area of a rank's allocation starts; identical on every rank.
struct ScratchGeometry {
  uint32_t region_bytes = 0;  // payload bytes per region per round (multiple of 128)
  int blocks = 0;             // block indices with regions (the grid bound)
  int nranks = 0;
  size_t flags_offset = 0;
  size_t sig_offset = 0;
  size_t ll_offset = 0;
  size_t sentinel_offset = 0;
  size_t plain_offset = 0;
  size_t atomic_offset = 0;
  size_t total_bytes = 0;
};

JAXLL_HOST_DEVICE inline size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Lays out a rank's allocation for `nranks` ranks, `blocks` block indices and
// `region_bytes` of payload per region (rounded up to a multiple of 128).
inline ScratchGeometry make_geometry(int nranks, int blocks, size_t region_bytes) {
  ScratchGeometry g;
  g.region_bytes = static_cast<uint32_t>(align_up(region_bytes, kLineBytes));
  g.blocks = blocks;
  g.nranks = nranks;
  const size_t regions = static_cast<size_t>(kPhases) * blocks * 2 * nranks;
  const size_t r = g.region_bytes;
  g.flags_offset = kHeaderBytes;
  g.sig_offset = align_up(g.flags_offset + sizeof(uint32_t) * kMaxBlocks * kMaxRanks, 256);
  g.ll_offset =
      align_up(g.sig_offset + static_cast<size_t>(blocks) * 2 * nranks * kLLPacketBytes, 4096);
  g.sentinel_offset = align_up(g.ll_offset + regions * 2 * r, 4096);
  g.plain_offset = align_up(g.sentinel_offset + regions * r, 4096);
  g.atomic_offset =
      align_up(g.plain_offset + static_cast<size_t>(kPhases) * blocks * nranks * r, 4096);
  g.total_bytes = align_up(g.atomic_offset + static_cast<size_t>(blocks) * 2 * r, 4096);
  return g;
}

// Index of the signature slot [block][parity][src].
JAXLL_HOST_DEVICE inline size_t signature_index(const ScratchGeometry& g, int block, int parity,
                                                int src) {
  return (static_cast<size_t>(block) * 2 + parity) * g.nranks + src;
}

// Index of the region [phase][block][parity][src] of a double-buffered area.
JAXLL_HOST_DEVICE inline size_t region_index(const ScratchGeometry& g, int phase, int block,
                                             int parity, int src) {
  return ((static_cast<size_t>(phase) * g.blocks + block) * 2 + parity) * g.nranks + src;
}

}  // namespace jaxll
