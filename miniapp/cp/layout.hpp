// Token layouts: which global tokens a rank holds, in local order. One function per
// layout, used by the schemes and by the tests alike (they slice the global reference with
// it). Positions are also the tokens' global indices.
//   contiguous - rank r holds [r*S/P, (r+1)*S/P)
//   zigzag     - 2P chunks, rank r holds chunks r and 2P-1-r (balances causal work)
//   striped    - token t on rank t mod P
//   usp        - zigzag over R ring ranks; each ring chunk pair split evenly over U Ulysses
//                ranks (rank = ring * U + ulysses), so an all-to-all over the Ulysses group
//                gives each member the whole zigzag shard of its ring rank
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace minicp::layout {

enum class Kind { Contiguous, Zigzag, Striped };

// Positions start, start + stride, ..., count of them: each layout is a few such runs, which
// is how the performance model (miniapp/predict/) reasons about a rank's rows without listing them.
struct Span {
  int64_t start = 0, count = 0, stride = 1;
  int64_t at(int64_t i) const { return start + i * stride; }
};
using Spans = std::vector<Span>;
// The rows of each layout as spans; the functions below expand these.
Spans contiguous_spans(int64_t S, int P, int r);
Spans zigzag_spans(int64_t S, int P, int r);
Spans striped_spans(int64_t S, int P, int r);
Spans usp_spans(int64_t S, int ring, int ulysses, int r);
Spans spans_of(Kind k, int64_t S, int P, int r);
std::vector<int64_t> expand(const Spans& s);
// Sorted positions as spans (runs of stride 1): a dispatch's tokens as the model reads them.
Spans spans_of_positions(const std::vector<int64_t>& positions);
int64_t count(const Spans& s);
// Rows [first, first + n) of s, in its order, as spans (a piece of a rank's rows, not listed).
Spans rows_of(const Spans& s, int64_t first, int64_t n);

std::vector<int64_t> contiguous(int64_t S, int P, int r);
std::vector<int64_t> zigzag(int64_t S, int P, int r);
std::vector<int64_t> striped(int64_t S, int P, int r);
std::vector<int64_t> usp(int64_t S, int ring, int ulysses, int r);
std::vector<int64_t> of(Kind k, int64_t S, int P, int r);
const char* name(Kind k);

// Divisibility each layout needs, as "" or a reason ("zigzag needs seq_len (100)
// divisible by 2*ranks (8)").
std::string check(Kind k, int64_t S, int P, const std::string& scheme);

}  // namespace minicp::layout
