// LaunchCapture (ffi/kernels/launch.h) on the host: inside its scope
// launch_collective launches nothing and describes the one launch of a call;
// what it cannot describe (a second launch, a virtual group, arguments too large,
// a cluster that does not divide the grid) it refuses. Prints "ok" or the first
// check that failed. Built by tests/test_launch_capture_cpu.py with nvcc.
#include <cstdio>
#include <cstring>

#include "kernels/launch.h"

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok && failures++ == 0) std::printf("failed: %s\n", what);
}

struct Args {
  int values[24];
  const void* pointer;
};

void kernel_stand_in() {}

}  // namespace

int main() {
  using jaxll::CapturedLaunch;
  using jaxll::LaunchCapture;
  using jaxll::launch_collective;
  const void* fn = reinterpret_cast<const void*>(&kernel_stand_in);
  Args args{};
  for (int i = 0; i < 24; ++i) args.values[i] = 3 * i + 1;
  args.pointer = &args;
  {
    LaunchCapture capture;
    check(capture.launch() == nullptr, "nothing described before a launch");
    check(launch_collective(fn, 8, 256, true, &args, nullptr, 2).ok(), "a launch is described");
    const CapturedLaunch* l = capture.launch();
    check(l != nullptr && l->fn == fn && l->blocks == 8 && l->threads == 256 && l->cluster == 2 &&
              l->pdl && l->args_bytes == sizeof(Args) &&
              std::memcmp(l->args, &args, sizeof(Args)) == 0,
          "the launch as described");
    args.values[0] = -1;
    check(l != nullptr && reinterpret_cast<const Args*>(l->args)->values[0] == 1,
          "the arguments are copied, not referenced");
    check(!capture.refused(), "nothing refused yet");
    check(launch_collective(fn, 8, 256, false, &args, nullptr).code() ==
              jaxll::StatusCode::kNoPlan &&
              capture.refused(),
          "a second launch is refused");
    check(capture.launch() == l && l->pdl, "the first launch stays");
    {
      LaunchCapture inner;
      check(launch_collective(fn, 4, 128, false, &args, nullptr, 1, 2).code() ==
                jaxll::StatusCode::kNoPlan,
            "a virtual group's launch is refused");
      check(inner.launch() == nullptr && inner.refused(), "a refused launch describes nothing");
      check(launch_collective(fn, 6, 128, false, &args, nullptr, 4).code() ==
                jaxll::StatusCode::kNoPlan,
            "a cluster that does not divide the grid is refused");
      static unsigned char big[CapturedLaunch::kMaxArgsBytes + 1];
      check(launch_collective(fn, 1, 32, false, big, sizeof(big), nullptr).code() ==
                jaxll::StatusCode::kNoPlan,
            "arguments over the limit are refused");
      check(launch_collective(fn, 1, 32, false, &args, nullptr).ok() && inner.launch() != nullptr &&
                inner.launch()->blocks == 1,
            "the innermost capture takes the launch");
    }
    check(capture.launch() == l && l->blocks == 8, "the outer capture is back and unchanged");
  }
  std::printf(failures ? "%d checks failed\n" : "ok\n", failures);
  return failures ? 1 : 0;
}
