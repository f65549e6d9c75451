// Trace helpers: names of event kinds, bytes leaving a rank per call, per-kind totals.
#include "comm/trace.hpp"

namespace minicp::comm {

const char* to_string(EventKind k) {
  switch (k) {
    case EventKind::SendRecv: return "sendrecv";
    case EventKind::AllToAll: return "alltoall";
    case EventKind::AllToAllV: return "alltoallv";
    case EventKind::AllGather: return "allgather";
    case EventKind::ReduceScatter: return "reduce_scatter";
    case EventKind::AllReduce: return "allreduce";
    case EventKind::Barrier: return "barrier";
    case EventKind::Compute: return "compute";
    case EventKind::Wait: return "wait";
    case EventKind::Kernel: return "kernel";
  }
  return "unknown";
}

int64_t bytes_leaving(EventKind kind, int64_t payload_bytes, int group_size) {
  const int64_t n = group_size, p = payload_bytes;
  switch (kind) {
    case EventKind::SendRecv:
    case EventKind::AllToAllV: return p;
    case EventKind::AllGather:
    case EventKind::ReduceScatter:
    case EventKind::AllToAll: return n > 1 ? p * (n - 1) : 0;
    case EventKind::AllReduce: return n > 1 ? 2 * (n - 1) * p / n : 0;
    case EventKind::Barrier:
    case EventKind::Compute:
    case EventKind::Wait:
    case EventKind::Kernel: return 0;
  }
  return 0;
}

double Trace::seconds(EventKind k) const {
  double s = 0;
  for (const auto& e : events_)
    if (e.kind == k) s += e.t_end - e.t_begin;
  return s;
}

int64_t Trace::bytes(EventKind k) const {
  int64_t b = 0;
  for (const auto& e : events_)
    if (e.kind == k) b += e.bytes;
  return b;
}

}  // namespace minicp::comm
