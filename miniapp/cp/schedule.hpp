// What a CP scheme does on one rank, step by step, as the performance model sees it: the
// attention calls it makes (which rows against which keys), the communicator calls it posts
// and whether they overlap the step's compute. Each scheme describes its own schedule
// (SchemeInfo::schedule, next to the code it describes); miniapp/predict/predict.cpp turns it
// into time. It is part of the scheme interface, so it sits in cp/: the model depends on the
// schemes and never the other way. Nothing here runs a kernel or sends a byte.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/trace.hpp"
#include "miniapp/cp/layout.hpp"

namespace minicp::predict {

using layout::Span;
using layout::Spans;

// One attention kernel call: the local query rows (global positions) against the key rows,
// `heads` query heads over `kv_heads` K/V heads, under the case's mask.
struct AttnCall {
  Spans q, kv;
  int heads = 0, kv_heads = 0;
};

// One communicator call: its kind, its payload (the argument of comm::bytes_leaving: the send
// size of a send-receive, the per-rank contribution of an all-gather ...), the size of its
// group and whether the traffic crosses nodes (a peer or a group member on another node).
struct CommCall {
  comm::EventKind op = comm::EventKind::SendRecv;
  int64_t payload = 0;
  int group = 1;
  bool inter = false;
};

// One step of a scheme on one rank. `overlapped` calls are posted before the step's compute
// and waited for after it; `exposed` ones are waited for before the compute can start.
// `aux_values`: values the step's element-wise work touches (merges of partial results,
// packing, zeroing and adding accumulators).
struct Step {
  std::vector<AttnCall> attn;
  std::vector<CommCall> overlapped, exposed;
  double aux_values = 0;
};

// The ranks of a job and how they sit on nodes (consecutive ranks share a node).
struct Topo {
  int ranks = 1, ranks_per_node = 1;
  int node(int r) const { return r / ranks_per_node; }
  bool same_node(int a, int b) const { return node(a) == node(b); }
  int nodes() const { return (ranks + ranks_per_node - 1) / ranks_per_node; }
  // Whether a group of `size` ranks, world ranks base + i*stride, spans nodes.
  bool spans_nodes(int base, int size, int stride) const { return node(base) != node(base + (size - 1) * stride); }
};

struct Schedule {
  std::vector<Step> steps;
};

}  // namespace minicp::predict
