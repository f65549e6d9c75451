// Memory check before allocating: a run whose predicted bytes per rank exceed the memory
// available per rank is refused at once with both numbers, instead of being killed (or
// swapping) after minutes of set-up.
//
// Available to a rank = min(MemAvailable of /proc/meminfo, memory.max - memory.current of
// this process's cgroup v2 and of every cgroup above it that sets a limit), divided by the
// ranks on its node.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>

#include "harness/main.hpp"

namespace minicp::harness {

// Bytes this process may still allocate on its node (see above); -1 when neither
// /proc/meminfo nor a cgroup limit can be read.
int64_t node_available_bytes();

// "512 B", "11.3 GiB", "1.2 TiB" (binary units, one decimal).
std::string human_bytes(double bytes);

// The refusal text: "<what>: needs 1.2 TiB per rank (predicted), 11.3 GiB available per rank
// (2 ranks on this node)"; node names the node when it is not "this node"; without per_rank
// (a single process): "<what>: needs 1.2 TiB (predicted), 11.3 GiB available".
std::string memory_message(const std::string& what, double predicted, double available, int local_ranks, bool per_rank,
                           const std::string& node = "this node");

// Throws UsageError (on every rank) when predicted_per_rank bytes exceed the memory available
// per rank on any node. local_ranks: the ranks on this process's node (1 under main_serial;
// MPI programs: comm::Communicator::node_topology().local_size).
// Collective under MPI. A node whose memory cannot be read does not refuse.
void check_memory(const Args& a, const std::string& what, double predicted_per_rank, int local_ranks);

}  // namespace minicp::harness
