#include "miniapp/cp/dispatch.hpp"

#include <algorithm>
#include <numeric>
#include <queue>
#include <stdexcept>
#include <utility>

namespace minicp::cp {

namespace {

// Piece i of n near-equal pieces of [lo, hi): the first (hi - lo) % n pieces one longer.
std::pair<int64_t, int64_t> piece(int64_t lo, int64_t hi, int64_t n, int64_t i) {
  const int64_t len = hi - lo, q = len / n, extra = len % n;
  const int64_t a = lo + i * q + std::min(i, extra);
  return {a, a + q + (i < extra ? 1 : 0)};
}

void append(std::vector<int64_t>& out, std::pair<int64_t, int64_t> range) {
  for (int64_t t = range.first; t < range.second; ++t) out.push_back(t);
}

// Zigzag over [lo, hi): rank r gets chunks r and 2P-1-r of 2P near-equal chunks.
void zigzag_into(std::vector<std::vector<int64_t>>& ranks, int64_t lo, int64_t hi) {
  const int64_t P = int64_t(ranks.size());
  for (int64_t r = 0; r < P; ++r) {
    append(ranks[size_t(r)], piece(lo, hi, 2 * P, r));
    append(ranks[size_t(r)], piece(lo, hi, 2 * P, 2 * P - 1 - r));
  }
}

// The documents' [start, end) over [0, S) (one document without documents).
std::vector<std::pair<int64_t, int64_t>> documents_of(const Mask& mask, int64_t S) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t at = 0;
  for (int64_t len : mask.doc_lengths(S)) out.push_back({at, at + len}), at += len;
  return out;
}

// Chunks of `chunk` tokens by area, largest first, to the rank with the least area among those
// with room: each rank takes floor or ceil of the chunks' share, the first ones the ceil.
// O(S + n log P) for n chunks.
void by_area(std::vector<std::vector<int64_t>>& ranks, const Mask& mask, int64_t S, int64_t chunk) {
  const int64_t P = int64_t(ranks.size()), n = (S + chunk - 1) / chunk;
  std::vector<std::pair<double, int64_t>> chunks;  // (area, index)
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> pos;
    append(pos, {i * chunk, std::min(S, (i + 1) * chunk)});
    chunks.push_back({mask_area(mask, pos, S), i});
  }
  std::stable_sort(chunks.begin(), chunks.end(), [](auto& a, auto& b) { return a.first > b.first; });
  std::vector<int64_t> room(size_t(P), n / P);
  for (int64_t r = 0; r < n % P; ++r) ++room[size_t(r)];
  std::vector<double> load(size_t(P), 0.0);
  // A short last chunk goes to rank 0 first, which has the most room: so no rank holds more
  // than one chunk's tokens above another.
  if (S % chunk != 0) {
    const auto last = std::find_if(chunks.begin(), chunks.end(), [&](auto& c) { return c.second == n - 1; });
    append(ranks[0], {(n - 1) * chunk, S});
    load[0] = last->first, --room[0];
    chunks.erase(last);
  }
  using Load = std::pair<double, int64_t>;  // (area so far, rank): the least on top
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> heap;
  for (int64_t r = 0; r < P; ++r)
    if (room[size_t(r)] > 0) heap.push({load[size_t(r)], r});
  for (const auto& [area, i] : chunks) {
    const auto [load, r] = heap.top();
    heap.pop();
    append(ranks[size_t(r)], {i * chunk, std::min(S, (i + 1) * chunk)});
    if (--room[size_t(r)] > 0) heap.push({load + area, r});
  }
}

}  // namespace

const std::vector<std::string>& Dispatch::names() {
  static const std::vector<std::string> n = {"contiguous", "zigzag", "striped", "doc-zigzag", "area"};
  return n;
}

Dispatch Dispatch::parse(const std::string& name, int64_t chunk) {
  const std::vector<std::string>& n = names();
  const auto it = std::find(n.begin(), n.end(), name);
  if (it == n.end()) {
    std::string all;
    for (const std::string& s : n) all += (all.empty() ? "" : ", ") + s;
    throw std::invalid_argument("dispatch \"" + name + "\": not one of " + all);
  }
  if (chunk < 1) throw std::invalid_argument("dispatch chunk: needs >= 1 token, got " + std::to_string(chunk));
  return {Kind(it - n.begin()), chunk};
}

const char* Dispatch::name() const { return names()[size_t(kind)].c_str(); }

std::vector<std::vector<int64_t>> dispatch_tokens(const Dispatch& d, const Mask& mask, int64_t S, int P) {
  if (P < 1 || S < 0) throw std::invalid_argument("dispatch: needs ranks >= 1 and a sequence");
  std::vector<std::vector<int64_t>> ranks(static_cast<size_t>(P));
  switch (d.kind) {
    case Dispatch::Kind::Contiguous:
      for (int r = 0; r < P; ++r) append(ranks[size_t(r)], piece(0, S, P, r));
      break;
    case Dispatch::Kind::Zigzag: zigzag_into(ranks, 0, S); break;
    case Dispatch::Kind::Striped:
      for (int64_t t = 0; t < S; ++t) ranks[size_t(t % P)].push_back(t);
      break;
    case Dispatch::Kind::DocZigzag:
      for (const auto& [a, b] : documents_of(mask, S)) zigzag_into(ranks, a, b);
      break;
    case Dispatch::Kind::Area: by_area(ranks, mask, S, d.chunk); break;
  }
  for (auto& r : ranks) std::sort(r.begin(), r.end());
  return ranks;
}

double mask_area(const Mask& mask, const std::vector<int64_t>& positions, int64_t S) {
  double pairs = 0;
  for (int64_t q : positions) {
    const auto [lo, hi] = mask.keys_of(q);
    pairs += double(std::max<int64_t>(0, std::min(hi, S - 1) - lo + 1));
  }
  return pairs;
}

}  // namespace minicp::cp
