// Token layouts (see layout.hpp).
#include "miniapp/cp/layout.hpp"

#include <algorithm>
#include <stdexcept>

namespace minicp::layout {

Spans contiguous_spans(int64_t S, int P, int r) { return {{r * (S / P), S / P, 1}}; }

Spans zigzag_spans(int64_t S, int P, int r) {
  const int64_t c = S / (2 * P);
  return {{r * c, c, 1}, {(2 * P - 1 - r) * c, c, 1}};
}

Spans striped_spans(int64_t S, int P, int r) { return {{r, S > r ? (S - r + P - 1) / P : 0, P}}; }

// Rank r = j*U + u holds piece u of each of ring rank j's two zigzag chunks.
Spans usp_spans(int64_t S, int ring, int ulysses, int r) {
  const int j = r / ulysses, u = r % ulysses;
  const int64_t c = S / (2 * ring), piece = c / ulysses;
  return {{j * c + u * piece, piece, 1}, {(2 * ring - 1 - j) * c + u * piece, piece, 1}};
}

Spans spans_of(Kind k, int64_t S, int P, int r) {
  switch (k) {
    case Kind::Contiguous: return contiguous_spans(S, P, r);
    case Kind::Zigzag: return zigzag_spans(S, P, r);
    case Kind::Striped: return striped_spans(S, P, r);
  }
  throw std::invalid_argument("unknown layout");
}

std::vector<int64_t> expand(const Spans& s) {
  std::vector<int64_t> out;
  out.reserve(size_t(count(s)));
  for (const Span& sp : s)
    for (int64_t i = 0; i < sp.count; ++i) out.push_back(sp.at(i));
  return out;
}

int64_t count(const Spans& s) {
  int64_t n = 0;
  for (const Span& sp : s) n += sp.count;
  return n;
}

std::vector<int64_t> contiguous(int64_t S, int P, int r) { return expand(contiguous_spans(S, P, r)); }
std::vector<int64_t> zigzag(int64_t S, int P, int r) { return expand(zigzag_spans(S, P, r)); }
std::vector<int64_t> striped(int64_t S, int P, int r) { return expand(striped_spans(S, P, r)); }
std::vector<int64_t> usp(int64_t S, int ring, int ulysses, int r) { return expand(usp_spans(S, ring, ulysses, r)); }

std::vector<int64_t> of(Kind k, int64_t S, int P, int r) {
  switch (k) {
    case Kind::Contiguous: return contiguous(S, P, r);
    case Kind::Zigzag: return zigzag(S, P, r);
    case Kind::Striped: return striped(S, P, r);
  }
  throw std::invalid_argument("unknown layout");
}

const char* name(Kind k) {
  switch (k) {
    case Kind::Contiguous: return "contiguous";
    case Kind::Zigzag: return "zigzag";
    case Kind::Striped: return "striped";
  }
  return "?";
}

std::string check(Kind k, int64_t S, int P, const std::string& scheme) {
  const int64_t need = k == Kind::Zigzag ? 2 * int64_t(P) : int64_t(P);
  if (S % need == 0) return "";
  return scheme + " needs seq_len (" + std::to_string(S) + ") divisible by " +
         (k == Kind::Zigzag ? "2*ranks (" : "ranks (") + std::to_string(need) + ")";
}

Spans spans_of_positions(const std::vector<int64_t>& positions) {
  Spans out;
  for (int64_t p : positions) {
    if (!out.empty() && out.back().stride == 1 && out.back().start + out.back().count == p)
      ++out.back().count;
    else
      out.push_back({p, 1, 1});
  }
  return out;
}

Spans rows_of(const Spans& s, int64_t first, int64_t n) {
  Spans out;
  for (const Span& sp : s) {
    if (n <= 0) break;
    if (first >= sp.count) {
      first -= sp.count;
      continue;
    }
    const int64_t take = std::min(n, sp.count - first);
    out.push_back({sp.at(first), take, sp.stride});
    n -= take, first = 0;
  }
  return out;
}

}  // namespace minicp::layout
