// Dispatch: which tokens each rank of a CP group holds, chosen apart from the scheme that
// computes on them. Every dispatch gives each rank a sorted list of global positions, every
// position to exactly one rank, for any sequence length, rank count and documents (no
// divisibility rule: a rank may hold a few tokens more than another).
//   contiguous  rank r holds the r-th of P near-equal runs
//   zigzag      2P near-equal chunks of the sequence, rank r holds chunks r and 2P-1-r
//   striped     token t on rank t mod P
//   doc-zigzag  zigzag within each document (its 2P chunks, near-equal), what TransformerEngine
//               and PyTorch do, here without their rule that each length divide by 2P
//   area        equal tokens per rank: the sequence cut into chunks of `chunk` tokens, each
//               weighed by its mask area (the visible keys of its queries), handed out largest
//               first to the rank with the least area that still has room (a heap): the
//               largest per-rank area, greedily small
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "miniapp/cp/mask.hpp"

namespace minicp::cp {

struct Dispatch {
  enum class Kind { Contiguous, Zigzag, Striped, DocZigzag, Area };
  Kind kind = Kind::Zigzag;
  int64_t chunk = 128;  // area: tokens per chunk
  static const std::vector<std::string>& names();
  static Dispatch parse(const std::string& name, int64_t chunk = 128);  // throws std::invalid_argument
  const char* name() const;
};

// The positions each of P ranks holds (sorted), for a sequence of S tokens under mask.
std::vector<std::vector<int64_t>> dispatch_tokens(const Dispatch& d, const Mask& mask, int64_t S, int P);

// The visible (query, key) pairs of queries at `positions` against the keys 0..S-1: the area a
// rank computes when it attends its own queries to the whole sequence (the ring family).
double mask_area(const Mask& mask, const std::vector<int64_t>& positions, int64_t S);

}  // namespace minicp::cp
