// Speed-of-light probes: the hardware latencies the paper's bound is built from.
//
//   SoL = 2 * L2_RTT + (pingpong_RTT - 2 * L2_RTT) / 2
//
// where L2_RTT is one __threadfence() after a store (a round trip to L2) and
// pingpong_RTT is a flag bounced between two blocks (on one GPU, or on two GPUs
// with peer access, each block polling its own memory and storing to the other's).
#pragma once

#include <cstdint>

namespace jaxll {

// Microseconds per __threadfence() in a single-thread loop on `device` (the
// paper's L2 round trip), or per store + __threadfence() with `with_store`.
double probe_l2_fence_us(int device, int iters, bool with_store);

// One-way latency in microseconds of a flag ping-pong between a block on
// `device_a` and a block on `device_b` (the same device is allowed: two blocks
// on two streams). Throws if the devices cannot reach each other or a wait
// times out.
double probe_pingpong_one_way_us(int device_a, int device_b, int iters);

}  // namespace jaxll
