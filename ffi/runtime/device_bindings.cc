// The devices' bindings: what the lowering and the multi-process setup ask of a
// GPU before they build a workspace on it.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cuda_runtime.h>

#include <string>

#include "runtime/bindings.h"
#include "runtime/kernel_loading.h"
#include "runtime/workspace.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace jaxll {
namespace {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

// The device's UUID as 32 hex digits (tells processes that share a GPU apart).
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

}  // namespace

void bind_devices(nb::module_& m) {
  m.def("device_count", &device_count, "Number of CUDA devices visible (0 without a driver).");
  m.def("device_memory_free", [](int ordinal) {
    DeviceGuard guard(ordinal);
    size_t free_bytes = 0, total = 0;
    check_cuda(cudaMemGetInfo(&free_bytes, &total), "querying device memory");
    return free_bytes;
  }, "ordinal"_a, "Free device memory in bytes (cudaMemGetInfo).");
  m.def("can_access_peer", [](int a, int b) {
    int ok = 0;
    check_cuda(cudaDeviceCanAccessPeer(&ok, a, b), "querying peer access");
    return ok != 0;
  }, "a"_a, "b"_a);
  m.def("peer_native_atomics", [](int a, int b) {
    int ok = 0;
    check_cuda(cudaDeviceGetP2PAttribute(&ok, cudaDevP2PAttrNativeAtomicSupported, a, b),
               "querying peer atomics");
    return ok != 0;
  }, "a"_a, "b"_a,
        "Whether device a's atomics on device b's memory are native over their link "
        "(NVLink: yes; PCIe: no, and then they are not atomic against b's own).");
  m.def("device_block_bound", [](int ordinal, int carveout) {
    nb::gil_scoped_release release;
    return device_block_bound(ordinal, carveout);
  }, "ordinal"_a, "carveout"_a, "Most co-resident blocks of jaxll's kernels on a device.");
  m.def("device_sm_count", [](int ordinal) {
    int sms = 0;
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal),
               "querying the SM count of CUDA device " + std::to_string(ordinal));
    return sms;
  }, "ordinal"_a, "Number of SMs of a device.");
  m.def("device_uuid", &device_uuid, "ordinal"_a);
}

}  // namespace jaxll
