// The jaxll low-latency device API: everything a collective kernel needs.
//
//   workspace_layout.h  layout of a rank's symmetric workspace
//   error_word.h        the error word written by a wait that gives up
//   ll_packet.cuh       LL16 packets: 8 B of data + flag in one 16 B store
//   spin_wait.cuh       bounded spin-waits on %globaltimer
//   rank_view.h         a kernel's view of its rank (peer table, epochs, deadline)
//   rank_view.cuh       scratch regions, per-block epochs and LL16 waits over it
//   elements.cuh        element types, reduction operators, packet I/O
#pragma once

#include "jaxll/elements.cuh"
#include "jaxll/error_word.h"
#include "jaxll/ll_packet.cuh"
#include "jaxll/rank_view.cuh"
#include "jaxll/rank_view.h"
#include "jaxll/spin_wait.cuh"
#include "jaxll/workspace_layout.h"
