#include "workspace.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <stdexcept>
#include <vector>

#include "../kernels/all_reduce.h"
#include "jaxll/error_word.h"
#include "jaxll/workspace_layout.h"

namespace jaxll {

void check_cuda(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear a sticky launch error so later calls are not confused
    throw std::runtime_error(what + ": " + cudaGetErrorName(err) + " (" +
                             cudaGetErrorString(err) + ")");
  }
}

namespace {

std::string where(const Rank& r) {
  return "group " + std::to_string(r.group) + " rank " + std::to_string(r.rank) +
         " (CUDA device " + std::to_string(r.ordinal) + ")";
}

// Kernels of tools built on the runtime (the bindings hand in the testing
// kernels) that every workspace loads along with jaxll's own.
std::mutex g_preload_mutex;
std::vector<const void*>& preloaded_kernels() {
  static std::vector<const void*> fns;
  return fns;
}

// One shared-memory carveout preference for every jaxll kernel (percent of the
// most shared memory; JAXLL_SMEM_CARVEOUT, default 0 = the most L1; -1 leaves
// the driver's choice). The kernels need almost no shared memory, but left to
// itself the driver picks a configuration per kernel from its block size, and
// an SM changes configuration only when idle: where ranks share a GPU, once
// spinning blocks of the ranks that arrived sit on every SM, a lagging rank's
// kernel that wants another configuration is placed nowhere and every rank
// times out (seen on one H200, benchmarks/README.md "Faults"; with one
// preference for every kernel it no longer happens, at no measured cost).
int shared_memory_carveout() {
  const char* env = std::getenv("JAXLL_SMEM_CARVEOUT");
  const std::string want = env ? env : "";
  if (want.empty()) return 0;
  char* end = nullptr;
  const long v = std::strtol(want.c_str(), &end, 10);
  const bool digits = want[0] == '-' || (want[0] >= '0' && want[0] <= '9');
  if (!digits || *end != '\0' || v < -1 || v > 100) {
    throw std::runtime_error("JAXLL_SMEM_CARVEOUT must be an integer from -1 to 100, got '" + want + "'");
  }
  return static_cast<int>(v);
}

// The collective kernels a workspace launches: with `group_twins` (virtual
// ranks) their twins for one launch of every rank too.
std::vector<const void*> collective_kernels(bool group_twins) {
  std::vector<const void*> fns = all_kernel_functions();
  if (group_twins) {
    const std::vector<const void*> twins = group_kernel_functions();
    fns.insert(fns.end(), twins.begin(), twins.end());
  }
  return fns;
}

// Loads every kernel jaxll may launch on the current device. With CUDA's lazy
// loading, a kernel loaded on first launch while a collective spins elsewhere
// can stall behind it until the collective's deadline; so nothing is left lazy.
// Loads kernel `fn` on the current device and sets its shared-memory carveout.
void load_kernel(const void* fn, int carveout) {
  cudaFuncAttributes attr;  // querying the attributes loads the kernel
  check_cuda(cudaFuncGetAttributes(&attr, fn), "loading jaxll kernels");
  if (carveout >= 0) {
    check_cuda(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, carveout),
               "setting the shared-memory carveout of jaxll kernels");
  }
}

std::vector<KernelLoader>& kernel_loaders() {
  static std::vector<KernelLoader> loaders;
  return loaders;
}

// Runs an extension's loader for CUDA device `ordinal`; throws its message.
void run_loader(KernelLoader load, int ordinal, int carveout) {
  char error[512] = {0};
  if (load(ordinal, carveout, error, sizeof(error)) != 0) {
    throw std::runtime_error("an extension's kernel loader (register_loader) failed on CUDA device " +
                             std::to_string(ordinal) + ": " + error);
  }
}

// Loads jaxll's kernels (and the preloaded ones) on the current device, then
// runs the extensions' loaders there.
void load_all_kernels(bool group_twins) {
  std::vector<const void*> fns = collective_kernels(group_twins);
  std::vector<KernelLoader> loaders;
  {
    std::lock_guard<std::mutex> lock(g_preload_mutex);
    fns.insert(fns.end(), preloaded_kernels().begin(), preloaded_kernels().end());
    loaders = kernel_loaders();
  }
  const int carveout = shared_memory_carveout();
  for (const void* fn : fns) load_kernel(fn, carveout);
  int ordinal = 0;
  check_cuda(cudaGetDevice(&ordinal), "querying the current device");
  for (KernelLoader load : loaders) run_loader(load, ordinal, carveout);
}

// Occupancy of the least-occupying collective kernel at kBlockThreads threads.
int min_blocks_per_sm(bool group_twins) {
  int best = 1 << 30;
  for (const void* fn : collective_kernels(group_twins)) {
    int blocks = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, kBlockThreads, 0),
               "querying kernel occupancy");
    best = std::min(best, blocks);
  }
  return best == (1 << 30) ? 1 : std::max(best, 1);
}

// Whether collective kernels on device `ordinal` launch with programmatic
// dependent launch on compute capability 9.0 and newer: JAXLL_PDL=0 turns it
// off, 1 on; unset, it is on except where ranks of several processes share a
// GPU. There (2 processes under CUDA MPS, examples/cg_solver.py) a rank was
// seen running a later call while blocks of its earlier call had not started,
// and both ranks timed out; with PDL off the same run passes
// (benchmarks/README.md, "Faults").
bool use_pdl(int ordinal, bool shared_gpu) {
  const char* env = std::getenv("JAXLL_PDL");
  const std::string want = env ? env : "";
  if (!want.empty() && want != "0" && want != "1") {
    throw std::runtime_error("JAXLL_PDL must be 0 or 1, got '" + want + "'");
  }
  if (want == "0" || (want.empty() && shared_gpu)) return false;
  int major = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal),
             "querying the compute capability");
  return major >= 9;
}

// Headers come from chunks that are never freed: a freed workspace leaves its
// headers behind, marked ErrorKind::kFreed, so that a command buffer recorded
// against it and replayed later reads a live header, sees the mark, poisons its
// output and touches no freed memory. kHeaderSlot bytes per rank and workspace.
constexpr size_t kHeaderSlot = 4096;
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

// The signature slots' idle content: packets ready for no epoch.
void write_idle_signatures(const Rank& r, const ScratchGeometry& geo, cudaStream_t s) {
  const size_t packets = static_cast<size_t>(geo.blocks) * 2 * geo.nranks;
  std::vector<uint64_t> idle(2 * packets);
  for (size_t i = 0; i < packets; ++i) {
    idle[2 * i] = 0;
    idle[2 * i + 1] = 1ull << 32;
  }
  check_cuda(cudaMemcpyAsync(static_cast<char*>(r.base) + geo.sig_offset, idle.data(),
                             idle.size() * sizeof(uint64_t), cudaMemcpyHostToDevice, s),
             "writing the signature slots");
  check_cuda(cudaStreamSynchronize(s), "writing the signature slots");
}

}  // namespace

void register_preloaded_kernels(const std::vector<const void*>& fns) {
  std::lock_guard<std::mutex> lock(g_preload_mutex);
  for (const void* fn : fns) {
    if (std::find(preloaded_kernels().begin(), preloaded_kernels().end(), fn) ==
        preloaded_kernels().end()) {
      preloaded_kernels().push_back(fn);
    }
  }
}

bool trap_on_error() {
  const char* env = std::getenv("JAXLL_ON_ERROR");
  const std::string want = env ? env : "";
  if (want.empty() || want == "poison") return false;
  if (want == "trap") return true;
  throw std::runtime_error("JAXLL_ON_ERROR must be 'poison' or 'trap', got '" + want + "'");
}

bool check_signatures() {
  const char* env = std::getenv("JAXLL_SIGNATURES");
  const std::string want = env ? env : "";
  if (want.empty() || want == "1") return true;
  if (want == "0") return false;
  throw std::runtime_error("JAXLL_SIGNATURES must be 0 or 1, got '" + want + "'");
}

int device_block_bound(int ordinal, bool group_twins) {
  DeviceGuard guard(ordinal);
  int sms = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal),
             "querying the multiprocessor count");
  load_all_kernels(group_twins);
  return sms * min_blocks_per_sm(group_twins);
}

std::string device_uuid(int ordinal) {
  cudaDeviceProp prop;
  check_cuda(cudaGetDeviceProperties(&prop, ordinal), "querying device properties");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 16; ++i) {
    const unsigned char b = static_cast<unsigned char>(prop.uuid.bytes[i]);
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

std::unique_ptr<Workspace> Workspace::Create(int id, const std::vector<std::vector<int>>& groups,
                                   bool virtual_ranks, const WorkspaceConfig& config,
                                   int max_blocks_agreed) {
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
  bool remote = false;
  for (const auto& g : groups)
    for (int o : g) remote = remote || o < 0;
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
  if (remote && max_blocks_agreed <= 0) {
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

  DeviceGuard guard;
  std::unique_ptr<Workspace> c(new Workspace());
  c->id_ = id;
  c->virtual_ranks_ = virtual_ranks;
  c->config_ = config;
  try {
    // Peer access between the members of a group that live in this process.
    if (!virtual_ranks) {
      for (const auto& g : groups) {
        for (int a : g) {
          for (int b : g) {
            if (a == b || a < 0 || b < 0) continue;
            int ok = 0;
            check_cuda(cudaDeviceCanAccessPeer(&ok, a, b), "querying peer access");
            if (!ok) {
              throw std::runtime_error("CUDA device " + std::to_string(a) +
                                       " cannot access the memory of device " +
                                       std::to_string(b));
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

    // Load every kernel on every local device and bound the grid so that all
    // blocks of all ranks sharing a device are co-resident. With ranks in other
    // processes the bound is agreed beforehand (see jaxll/workspace.py).
    const int ranks_per_device = virtual_ranks ? static_cast<int>(n) : 1;
    int max_blocks = kMaxBlocks;
    std::vector<int> seen;
    for (const auto& g : groups) {
      for (int o : g) {
        if (o < 0 || std::find(seen.begin(), seen.end(), o) != seen.end()) continue;
        seen.push_back(o);
        max_blocks = std::min(max_blocks, device_block_bound(o, virtual_ranks) / ranks_per_device);
      }
    }
    if (max_blocks_agreed > 0) max_blocks = std::min(max_blocks_agreed, kMaxBlocks);
    if (max_blocks < 1) {
      throw std::runtime_error("the device cannot hold one block per rank for " +
                               std::to_string(n) + " ranks");
    }
    c->max_blocks_ = max_blocks;
    const size_t region = (config.scratch_bytes + max_blocks - 1) / max_blocks;
    if (region > 0x7FFFFFFFull) throw std::runtime_error("scratch_bytes is too large");
    c->geo_ = make_geometry(static_cast<int>(n), max_blocks, region);

    // Allocate and clear every local rank's workspace.
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      c->groups_.emplace_back();
      for (size_t r = 0; r < n; ++r) {
        if (groups[gi][r] < 0) {
          c->groups_.back().push_back(nullptr);
          continue;
        }
        auto rk = std::make_unique<Rank>();
        rk->group = static_cast<int>(gi);
        rk->rank = static_cast<int>(r);
        rk->ordinal = groups[gi][r];
        check_cuda(cudaSetDevice(rk->ordinal), "selecting a device");
        check_cuda(cudaMalloc(&rk->base, c->bytes_per_rank()),
                   "allocating " + std::to_string(c->bytes_per_rank()) + " bytes of workspace on " +
                       where(*rk));
        rk->header = take_header(rk->ordinal);
        check_cuda(cudaHostAlloc(reinterpret_cast<void**>(&rk->host_error),
                                 kHostErrorWords * sizeof(unsigned long long),
                                 cudaHostAllocMapped | cudaHostAllocPortable),
                   "allocating the host error record");
        if (virtual_ranks) {
          check_cuda(cudaStreamCreateWithFlags(&rk->stream, cudaStreamNonBlocking),
                     "creating a virtual rank's stream");
          check_cuda(cudaEventCreateWithFlags(&rk->done, cudaEventDisableTiming),
                     "creating an event");
        }
        // Cleared before any handle to this memory leaves the process.
        cudaStream_t s;
        check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "creating a stream");
        try {
          c->clear_rank(*rk, s);
        } catch (...) {
          cudaStreamDestroy(s);
          c->groups_.back().push_back(std::move(rk));
          throw;
        }
        cudaStreamDestroy(s);
        c->groups_.back().push_back(std::move(rk));
      }
    }
    if (virtual_ranks) {
      check_cuda(cudaSetDevice(groups[0][0]), "selecting a device");
      check_cuda(cudaEventCreateWithFlags(&c->fork_, cudaEventDisableTiming),
                 "creating an event");
    }
    if (!remote) c->connect({});
  } catch (...) {
    c->release();
    throw;
  }
  return c;
}

void Workspace::clear_rank(Rank& r, cudaStream_t s) const {
  // Everything starts zero (header epochs and error word, flags, LL16 slots,
  // atomic lines) except the sentinel scratch, which starts poisoned, and the
  // signature slots, which start idle.
  const ScratchGeometry& geo = geo_;
  cudaError_t e = cudaMemsetAsync(r.base, 0, geo.total_bytes, s);
  if (e == cudaSuccess) {
    e = cudaMemsetAsync(static_cast<char*>(r.base) + geo.sentinel_offset, kSentinelByte,
                        geo.plain_offset - geo.sentinel_offset, s);
  }
  if (e == cudaSuccess) {
    e = cudaMemsetAsync(r.header, 0, offsetof(WorkspaceHeader, peer_bases), s);
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  check_cuda(e, "clearing the workspace of " + where(r));
  write_idle_signatures(r, geo, s);
  for (int i = 0; i < kHostErrorWords; ++i) {
    reinterpret_cast<volatile unsigned long long*>(r.host_error)[i] = 0;
  }
}

void Workspace::quiesce() const {
  DeviceGuard guard;
  for (auto& g : groups_) {
    for (auto& r : g) {
      if (!r) continue;
      check_cuda(cudaSetDevice(r->ordinal), "selecting a device");
      if (r->stream) check_cuda(cudaStreamSynchronize(r->stream), "waiting for a virtual rank");
      check_cuda(cudaDeviceSynchronize(), "waiting for the device to go idle");
    }
  }
}

void Workspace::reset() {
  quiesce();
  DeviceGuard guard;
  for (auto& g : groups_) {
    for (auto& r : g) {
      if (!r) continue;
      check_cuda(cudaSetDevice(r->ordinal), "selecting a device");
      cudaStream_t s;
      check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "creating a stream");
      try {
        clear_rank(*r, s);
      } catch (...) {
        cudaStreamDestroy(s);
        throw;
      }
      cudaStreamDestroy(s);
    }
  }
}

std::vector<std::string> Workspace::ipc_handles() const {
  std::vector<std::string> out;
  DeviceGuard guard;
  exported_ = true;  // (set before any handle leaves: a partly exported workspace counts)
  for (const auto& g : groups_) {
    for (const auto& r : g) {
      if (!r) continue;
      check_cuda(cudaSetDevice(r->ordinal), "selecting a device");
      cudaIpcMemHandle_t h;
      check_cuda(cudaIpcGetMemHandle(&h, r->base), "exporting a CUDA IPC handle of " + where(*r));
      out.emplace_back(reinterpret_cast<const char*>(&h), sizeof(h));
    }
  }
  return out;
}

void Workspace::connect(const std::vector<std::vector<std::string>>& handles) {
  if (connected_) throw std::runtime_error("workspace already connected");
  DeviceGuard guard;
  const size_t n = static_cast<size_t>(group_size());
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    auto& g = groups_[gi];
    for (auto& rk : g) {
      if (!rk) continue;
      check_cuda(cudaSetDevice(rk->ordinal), "selecting a device");
      PeerTable table{};
      WorkspaceHeader header{};
      for (size_t p = 0; p < n; ++p) {
        if (g[p]) {
          table.base[p] = static_cast<char*>(g[p]->base);
        } else {
          if (gi >= handles.size() || p >= handles[gi].size() ||
              handles[gi][p].size() != sizeof(cudaIpcMemHandle_t)) {
            throw std::runtime_error("no CUDA IPC handle for group " + std::to_string(gi) +
                                     " rank " + std::to_string(p));
          }
          cudaIpcMemHandle_t h;
          std::memcpy(&h, handles[gi][p].data(), sizeof(h));
          void* ptr = nullptr;
          check_cuda(cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess),
                     "opening the CUDA IPC handle of group " + std::to_string(gi) + " rank " +
                         std::to_string(p) + " on " + where(*rk));
          opened_.push_back({rk->ordinal, ptr});
          table.base[p] = static_cast<char*>(ptr);
        }
        header.peer_bases[p] = table.base[p];
      }
      RankView& v = rk->view;
      v.header = rk->header;
      unsigned long long* dev_err = nullptr;
      check_cuda(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_err), rk->host_error, 0),
                 "mapping the host error word");
      v.host_error = dev_err;
      v.peers = table;
      v.geo = geo_;
      v.rank = rk->rank;
      v.nranks = static_cast<int>(n);
      v.max_blocks = max_blocks_;
      v.pdl = use_pdl(rk->ordinal, config_.shared_gpu) ? 1 : 0;
      v.timeout_ns = config_.timeout_ms * 1000000ull;
      v.trap = trap_on_error() ? 1 : 0;
      v.signatures = check_signatures() ? 1 : 0;
      check_cuda(cudaMemcpy(&rk->header->peer_bases, header.peer_bases, sizeof(header.peer_bases),
                            cudaMemcpyHostToDevice),
                 "writing the header of " + where(*rk));
    }
  }
  connected_ = true;
}

Rank* Workspace::rank_for_ordinal(int ordinal) const {
  if (virtual_ranks_) return nullptr;
  for (const auto& g : groups_) {
    for (const auto& r : g) {
      if (r && r->ordinal == ordinal) return r.get();
    }
  }
  return nullptr;
}

void Workspace::set_epochs(uint64_t epoch) {
  DeviceGuard guard;
  WorkspaceHeader h{};
  for (int b = 0; b < kMaxBlocks; ++b) h.epochs[b] = epoch;
  // Scratch as that history would have left it: every LL16 slot carries the
  // last epoch's flag, every barrier flag the last barrier's value.
  const size_t ll_words = (geo_.sentinel_offset - geo_.ll_offset) / 4;
  std::vector<uint32_t> ll(ll_words, 0u);
  for (size_t i = 1; i < ll_words; i += 2) ll[i] = static_cast<uint32_t>(epoch);
  std::vector<uint32_t> flags(kMaxBlocks * kMaxRanks, static_cast<uint32_t>(epoch * 4 + 3));
  for (auto& g : groups_) {
    for (auto& r : g) {
      if (!r) continue;
      check_cuda(cudaSetDevice(r->ordinal), "selecting a device");
      check_cuda(cudaDeviceSynchronize(), "waiting for the device");
      char* base = static_cast<char*>(r->base);
      check_cuda(cudaMemcpy(r->header->epochs, h.epochs, sizeof(h.epochs), cudaMemcpyHostToDevice),
                 "setting epochs");
      check_cuda(cudaMemcpy(base + geo_.ll_offset, ll.data(), ll_words * 4, cudaMemcpyHostToDevice),
                 "setting LL16 flags");
      check_cuda(cudaMemcpy(base + geo_.flags_offset, flags.data(), flags.size() * 4,
                            cudaMemcpyHostToDevice),
                 "setting barrier flags");
    }
  }
}

uint64_t Workspace::error_word(const Rank& r) const {
  return r.host_error ? *reinterpret_cast<volatile unsigned long long*>(r.host_error) : 0;
}

std::string Workspace::describe_error(const Rank& r, uint64_t word) const {
  const DecodedError d = decode_error(word);
  std::string msg = "jaxll: workspace " + std::to_string(id_) + ", " + where(r) + ": ";
  const volatile unsigned long long* rec = r.host_error;
  if (d.kind == ErrorKind::kMismatch) {
    msg += "rank " + std::to_string(d.rank) + " and rank " + std::to_string(d.peer) +
           " made different calls (block " + std::to_string(d.block) + ", epoch " +
           std::to_string(d.epoch) + "): rank " + std::to_string(d.rank) + " called " +
           describe_signature(rec ? rec[1] : 0) + "; rank " + std::to_string(d.peer) +
           " called " + describe_signature(rec ? rec[2] : 0) +
           ". Every rank of a group must make the same jaxll calls in the same order. The "
           "outputs of this call are poisoned (all-ones bits, NaN for floats), and so are "
           "those of every later call on this workspace until jaxll.reset() is called on "
           "every rank.";
  } else if (d.kind == ErrorKind::kTimeout || d.kind == ErrorKind::kNotStarted) {
    msg += "rank " + std::to_string(d.rank) + " waited more than " +
           std::to_string(config_.timeout_ms) + " ms for rank " + std::to_string(d.peer) +
           (d.kind == ErrorKind::kNotStarted ? " to start its call" : "") + " (block " +
           std::to_string(d.block) + ", epoch " + std::to_string(d.epoch) +
           ") and gave up. The ranks of this group are out of step: a rank did not run the "
           "same sequence of jaxll calls, or was not scheduled, or has died. Results of this "
           "and every later call on this workspace are poisoned (all-ones bits, NaN for "
           "floats) until jaxll.reset() is called on every rank.";
  } else {
    char hex[32];
    std::snprintf(hex, sizeof(hex), "0x%016llx", static_cast<unsigned long long>(word));
    msg += std::string("unknown error word ") + hex;
  }
  return msg;
}

void Workspace::close_imports() {
  DeviceGuard guard;
  for (auto& g : groups_) {
    for (auto& r : g) {
      if (r) {
        cudaSetDevice(r->ordinal);
        cudaDeviceSynchronize();
      }
    }
  }
  for (const auto& [ordinal, ptr] : opened_) {
    cudaSetDevice(ordinal);
    cudaIpcCloseMemHandle(ptr);
  }
  opened_.clear();
  connected_ = false;
}

void Workspace::release(bool keep_exported) {
  DeviceGuard guard;
  close_imports();
  const bool keep = keep_exported && exported_;
  for (auto& g : groups_) {
    for (auto& r : g) {
      if (!r) continue;
      cudaSetDevice(r->ordinal);
      if (r->stream) cudaStreamSynchronize(r->stream);
      cudaDeviceSynchronize();
      if (r->header) {
        // The header stays (see take_header), marked freed.
        const unsigned long long freed = encode_error(ErrorKind::kFreed, r->rank, 0, 0, 0);
        cudaMemcpy(&r->header->error, &freed, sizeof(freed), cudaMemcpyHostToDevice);
      }
      if (r->base && !keep) cudaFree(r->base);  // (kept: left to the process's end)
      if (r->host_error) cudaFreeHost(r->host_error);
      if (r->stream) cudaStreamDestroy(r->stream);
      if (r->done) cudaEventDestroy(r->done);
      r->base = nullptr;
      r->host_error = nullptr;
      r->stream = nullptr;
      r->done = nullptr;
    }
  }
  if (fork_) cudaEventDestroy(fork_);
  fork_ = nullptr;
  groups_.clear();
  cudaGetLastError();
}

Workspace::~Workspace() { release(); }

// ---------------------------------------------------------------------------
// Registry

namespace {
constexpr int kMaxWorkspaces = 4096;
std::atomic<Workspace*> g_workspaces[kMaxWorkspaces];
std::atomic<int> g_holds[kMaxWorkspaces];  // live WorkspaceRefs that found workspace id
std::mutex g_mu;
int g_next_id = 1;
}  // namespace

int workspace_create(const std::vector<std::vector<int>>& groups, bool virtual_ranks,
                const WorkspaceConfig& config, int max_blocks_agreed) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_next_id >= kMaxWorkspaces) throw std::runtime_error("too many jaxll workspaces created");
  const int id = g_next_id;
  std::unique_ptr<Workspace> c = Workspace::Create(id, groups, virtual_ranks, config, max_blocks_agreed);
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
  std::vector<int> ordinals;  // of this process's ranks of the workspaces built so far
  {
    std::lock_guard<std::mutex> lock(g_mu);  // (no workspace is freed meanwhile)
    for (int i = 1; i < g_next_id; ++i) {
      const Workspace* c = g_workspaces[i].load(std::memory_order_acquire);
      if (c == nullptr) continue;
      for (int g = 0; g < c->group_count(); ++g) {
        for (int r = 0; r < c->group_size(); ++r) {
          if (!c->has_rank(g, r)) continue;
          const int o = c->rank(g, r).ordinal;
          if (std::find(ordinals.begin(), ordinals.end(), o) == ordinals.end()) ordinals.push_back(o);
        }
      }
    }
  }
  const int carveout = shared_memory_carveout();
  for (int o : ordinals) run_loader(load, o, carveout);  // (throws: not registered)
  std::lock_guard<std::mutex> lock(g_preload_mutex);
  if (std::find(kernel_loaders().begin(), kernel_loaders().end(), load) == kernel_loaders().end())
    kernel_loaders().push_back(load);
}

}  // namespace jaxll
