// The synchronisation protocols of the device API (host and device).
#pragma once

namespace jaxll {

// How data signals its own arrival in scratch:
//   kLL        LL16 packets (ll_packet.cuh): 8 bytes of data and the round's
//              epoch as flag in one 16-byte store; nothing to reset
//   kSentinel  data stored into scratch that holds the sentinel pattern
//              (sentinel.cuh); the reader writes the pattern back
//   kBarrier   plain stores, ordered by explicit flag barriers (flag_barrier.cuh;
//              the baselines)
enum class Proto { kLL, kSentinel, kBarrier };

}  // namespace jaxll
