// Per-rank trace buffer: one Event per communication call (and, from the schemes, per
// attention block; from the layer, per kernel), with wall-clock times from MPI_Wtime and
// the context the caller set (layer, pass, rep, mode). minicp writes it to HDF5.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace minicp::comm {

enum class EventKind : int32_t {
  SendRecv = 0,   // one non-blocking send/recv pair (t_end = when wait returned)
  AllToAll,       // all-to-all (equal blocks)
  AllToAllV,      // all-to-all with per-peer counts
  AllGather,      // (i)allgather
  ReduceScatter,  // (i)reduce-scatter
  AllReduce,      // all-reduce
  Barrier,
  Compute,  // a compute block recorded by a scheme (bytes = 0, flops set)
  Wait,     // time the caller spent blocked in wait()
  Kernel,   // a layer kernel (label: its phase, model::Phase; flops: its FLOPs)
};
const char* to_string(EventKind k);

// Bytes that leave this rank in one call on a group of n = group_size ranks: the data
// volume of the op's bandwidth-optimal algorithm, whatever algorithm the backend runs (the
// convention of the nccl-tests bus-bandwidth factors), so that schemes compare by what they
// ask the network to move. This is the one definition of "bytes sent": Event::bytes,
// Communicator::bytes_sent and the schemes' figures all come from it. Per kind:
//   SendRecv       payload = the send size, 0 when the destination is this rank   -> payload
//   AllGather      payload = b, the bytes this rank contributes                   -> b (n-1)
//   ReduceScatter  payload = c e, c elements of e bytes (this rank's result)      -> c e (n-1)
//   AllToAll       payload = b, the bytes for each destination (own one stays)    -> b (n-1)
//   AllToAllV      payload = the sum of the send sizes to the other ranks         -> payload
//   AllReduce      payload = p, the buffer                                        -> 2 (n-1) p / n
//                  (rounded down; 0 at n = 1)
//   Barrier, Compute, Wait, Kernel                                                -> 0
int64_t bytes_leaving(EventKind kind, int64_t payload_bytes, int group_size);

struct Event {
  EventKind kind;
  int32_t peer;           // destination rank in the group (p2p) or -1
  int32_t group;          // id of the group the call ran on
  int32_t step;           // scheme step, or -1
  int64_t bytes;          // bytes that left this rank, see bytes_leaving
  double flops;           // compute events: executed FLOPs
  double t_begin, t_end;  // MPI_Wtime seconds
  // Where the event comes from: the context the caller set (-1 when not set), taken when the
  // operation is posted (Communicator::posted), so a non-blocking operation and the wait for
  // it carry the layer that posted them, not the one that waited; else when Trace::add runs.
  int32_t layer = -1, pass = -1, rep = -1, mode = -1;  // pass: 0 forward, 1 backward
  int32_t label = -1;                                  // Kernel events: the phase
  bool stamped = false;                                // the four fields above are set
};

// Where events come from, set by the driver (rep, mode) and the layer (layer, pass).
struct TraceContext {
  int32_t layer = -1, pass = -1, rep = -1, mode = -1;
};

class Trace {
 public:
  void add(const Event& e) {
    if (!enabled_) return;
    events_.push_back(e);
    if (!e.stamped) stamp(events_.back());
  }
  // Sets e's layer, pass, rep and mode from the current context.
  void stamp(Event& e) const {
    e.layer = ctx_.layer, e.pass = ctx_.pass, e.rep = ctx_.rep, e.mode = ctx_.mode;
    e.stamped = true;
  }
  TraceContext& context() { return ctx_; }
  const std::vector<Event>& events() const { return events_; }
  void clear() { events_.clear(); }
  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  // Sum of (t_end - t_begin) and of bytes over events of one kind.
  double seconds(EventKind k) const;
  int64_t bytes(EventKind k) const;

 private:
  std::vector<Event> events_;
  bool enabled_ = true;
  TraceContext ctx_;
};

}  // namespace minicp::comm
