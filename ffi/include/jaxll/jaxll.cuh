// The jaxll low-latency device API: everything a collective kernel needs.
//
//   workspace_layout.h  layout of a rank's symmetric workspace (scratch areas)
//   error_word.h        the error word written by a wait that gives up
//   memory_ops.cuh      system-scope loads, stores, fences
//   ll_packet.cuh       LL16 packets: 8 B of data + flag in one 16 B store
//   sentinel.cuh        the sentinel protocol: data into pre-poisoned scratch
//   ll128_atomic.cuh    128 B lines reduced by vector atomics with a counter
//   spin_wait.cuh       bounded spin-waits on %globaltimer
//   rank_view.h         a kernel's view of its rank (peer table, geometry, deadline)
//   rank_view.cuh       scratch regions, per-block epochs and LL16 waits over it
//   flag_barrier.cuh    an explicit cross-rank flag barrier (for baselines)
//   launch_order.cuh    programmatic dependent launch: wait for / release the next kernel
//   elements.cuh        element types, reduction operators, packet I/O
//   protocol.h          the protocols (LL16, sentinel, plain)
//   units.cuh           transfer units: load, store, poison, rank-order reduction
//   round.cuh           rounds and call signatures: a call's start, round
//                       boundaries, failure vote, the signature exchange
//   channel.cuh         channels: send, broadcast, receive, receive-and-reduce,
//                       release, over a round's scratch
#pragma once

#include "jaxll/channel.cuh"
#include "jaxll/elements.cuh"
#include "jaxll/error_word.h"
#include "jaxll/flag_barrier.cuh"
#include "jaxll/launch_order.cuh"
#include "jaxll/ll128_atomic.cuh"
#include "jaxll/ll_packet.cuh"
#include "jaxll/memory_ops.cuh"
#include "jaxll/protocol.h"
#include "jaxll/rank_view.cuh"
#include "jaxll/rank_view.h"
#include "jaxll/round.cuh"
#include "jaxll/sentinel.cuh"
#include "jaxll/spin_wait.cuh"
#include "jaxll/units.cuh"
#include "jaxll/workspace_layout.h"
