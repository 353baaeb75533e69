// The extension module custom_collective._broadcast: the XLA FFI handler of
// "custom_broadcast" and init(), which takes jaxll's extension API table.
#include <nanobind/nanobind.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "broadcast_kernel.h"
#include "jaxll/extension.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;

namespace custom_collective {
namespace {

const jaxll::ExtensionApi* g_api = nullptr;

// The loader init() registers with jaxll (register_loader, jaxll/extension.h).
int load_kernels(int ordinal, int carveout, char* error, size_t error_len) {
  const cudaError_t e = load_broadcast_kernel(ordinal, carveout);
  if (e == cudaSuccess) return 0;
  std::snprintf(error, error_len, "custom_collective: loading the broadcast kernel on CUDA device %d: %s",
                ordinal, cudaGetErrorString(e));
  return 1;
}

// operands: x, order (jaxll's 4-byte order buffer, never touched);
// results: y, order; attributes: workspace (the workspace id), root
ffi::Error BroadcastExecute(cudaStream_t stream, int32_t ordinal, ffi::AnyBuffer x,
                            ffi::AnyBuffer /*order*/, ffi::Result<ffi::AnyBuffer> y,
                            ffi::Result<ffi::AnyBuffer> /*order_out*/, int64_t workspace,
                            int64_t root) {
  if (g_api == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "custom_broadcast: init(jaxll.extension.api()) was not called");
  }
  jaxll::RankView view;
  char error[512];
  const int status = g_api->get_rank_view(workspace, ordinal, &view, error, sizeof(error));
  if (status != jaxll::kExtensionOk) {
    return ffi::Error(status == jaxll::kExtensionHasError ? ffi::ErrorCode::kAborted
                                                          : ffi::ErrorCode::kFailedPrecondition,
                      error);
  }
  if (y->size_bytes() != x.size_bytes()) {
    return ffi::Error::InvalidArgument("custom_broadcast: output must match the input");
  }
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != ordinal) cudaSetDevice(ordinal);
  const cudaError_t e = launch_broadcast(view, x.untyped_data(), y->untyped_data(),
                                         static_cast<int64_t>(x.size_bytes()),
                                         static_cast<int>(root), stream);
  if (e != cudaSuccess) {
    return ffi::Error::Internal(std::string("custom_broadcast: launch failed: ") +
                                cudaGetErrorString(e));
  }
  return ffi::Error::Success();
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("virtual_broadcast: ") + what + ": " + cudaGetErrorString(e));
  }
}

// Device memory and streams of one virtual_broadcast, freed however it ends.
struct VirtualRun {
  char* in = nullptr;
  char* out = nullptr;
  std::vector<cudaStream_t> streams;
  ~VirtualRun() {
    for (cudaStream_t s : streams) cudaStreamDestroy(s);
    cudaFree(in);
    cudaFree(out);
  }
};

// The broadcast on the `nranks` virtual ranks of workspace `workspace`
// (jaxll.tools.testing.virtual_workspace, on CUDA device `ordinal`), driven from the
// host: rank r's input is bytes [r * size, (r + 1) * size) of `inputs`; returns
// every rank's output, concatenated the same way. The ranks' kernels go
// breadth-first, each on a stream of its own, as the extension API asks.
nb::bytes virtual_broadcast(int64_t workspace, int ordinal, int nranks, nb::bytes inputs,
                            int root) {
  if (g_api == nullptr) throw std::runtime_error("virtual_broadcast: init() was not called");
  if (nranks < 1 || inputs.size() % static_cast<size_t>(nranks) != 0) {
    throw std::invalid_argument("virtual_broadcast: the inputs must split into nranks equal parts");
  }
  const size_t total = inputs.size();
  const size_t size = total / static_cast<size_t>(nranks);
  char error[512];
  std::vector<jaxll::RankView> views(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    if (g_api->get_rank_view_of(workspace, 0, r, &views[r], error, sizeof(error)) != jaxll::kExtensionOk) {
      throw std::runtime_error(error);
    }
  }
  const std::string host_in(inputs.c_str(), total);
  std::string result(total, '\0');
  {
    nb::gil_scoped_release release;  // (the kernels may wait up to the workspace's timeout)
    int previous = -1;
    cudaGetDevice(&previous);
    struct DeviceRestore {
      int device;
      ~DeviceRestore() {
        if (device >= 0) cudaSetDevice(device);
      }
    } restore{previous};
    check(cudaSetDevice(ordinal), "selecting the device");
    VirtualRun run;
    check(cudaMalloc(&run.in, total), "allocating the inputs");
    check(cudaMalloc(&run.out, total), "allocating the outputs");
    check(cudaMemcpy(run.in, host_in.data(), total, cudaMemcpyHostToDevice), "copying the inputs");
    check(cudaMemset(run.out, 0, total), "clearing the outputs");
    for (int r = 0; r < nranks; ++r) {
      cudaStream_t s;
      check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "creating a stream");
      run.streams.push_back(s);
    }
    check(cudaDeviceSynchronize(), "before the call");
    for (int r = 0; r < nranks; ++r) {
      const cudaError_t e = launch_broadcast(views[r], run.in + r * size, run.out + r * size,
                                             static_cast<int64_t>(size), root, run.streams[r]);
      if (e != cudaSuccess) {
        // the ranks launched before it wait for it until the timeout, then record it
        for (int k = 0; k < r; ++k) cudaStreamSynchronize(run.streams[k]);
        throw std::runtime_error("virtual_broadcast: launching rank " + std::to_string(r) +
                                 " failed (" + cudaGetErrorString(e) +
                                 "); the ranks before it gave up waiting: call jaxll.reset()");
      }
    }
    for (cudaStream_t s : run.streams) check(cudaStreamSynchronize(s), "running the kernels");
    check(cudaMemcpy(result.data(), run.out, total, cudaMemcpyDeviceToHost), "copying the outputs");
  }
  for (int r = 0; r < nranks; ++r) {  // a wait that gave up: raise, as the FFI target does
    jaxll::RankView unused;
    if (g_api->get_rank_view_of(workspace, 0, r, &unused, error, sizeof(error)) != jaxll::kExtensionOk) {
      throw std::runtime_error(error);
    }
  }
  return nb::bytes(result.data(), result.size());
}

}  // namespace
}  // namespace custom_collective

XLA_FFI_DEFINE_HANDLER_SYMBOL(custom_broadcast_handler, custom_collective::BroadcastExecute,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("workspace")
                                  .Attr<int64_t>("root"));

NB_MODULE(_broadcast, m) {
  m.def("init", [](nb::capsule api) {
    if (std::string(api.name()) != "jaxll.extension_api") {
      throw std::invalid_argument("init() takes jaxll.extension.api()");
    }
    const auto* table = static_cast<const jaxll::ExtensionApi*>(api.data());
    if (table->version != jaxll::kExtensionApiVersion ||
        table->rank_view_bytes != sizeof(jaxll::RankView)) {
      throw std::runtime_error(
          "custom_collective was built against other jaxll headers (extension API version " +
          std::to_string(jaxll::kExtensionApiVersion) + ", RankView of " +
          std::to_string(sizeof(jaxll::RankView)) + " bytes; the installed jaxll has " +
          std::to_string(table->version) + " and " + std::to_string(table->rank_view_bytes) +
          "): rebuild it");
    }
    // jaxll runs the loader on every workspace's devices while it builds them
    // (never inside a step), as it loads its own kernels
    char error[512];
    if (table->register_loader(&custom_collective::load_kernels, error, sizeof(error)) !=
        jaxll::kExtensionOk) {
      throw std::runtime_error(error);
    }
    custom_collective::g_api = table;
  }, nb::arg("api"));
  m.def("virtual_broadcast", &custom_collective::virtual_broadcast, nb::arg("workspace"),
        nb::arg("ordinal"), nb::arg("nranks"), nb::arg("inputs"), nb::arg("root"));
  m.def("handler", [] {
    return nb::capsule(reinterpret_cast<void*>(&custom_broadcast_handler));
  });
}
