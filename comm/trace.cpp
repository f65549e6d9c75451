// Trace helpers: names of event kinds and per-kind totals.
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
  }
  return "unknown";
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
