// Token layouts (see layout.hpp).
#include "miniapp/layout.hpp"

#include <stdexcept>

namespace minicp::layout {

std::vector<int64_t> contiguous(int64_t S, int P, int r) {
  std::vector<int64_t> out;
  const int64_t n = S / P;
  for (int64_t i = 0; i < n; ++i) out.push_back(r * n + i);
  return out;
}

std::vector<int64_t> zigzag(int64_t S, int P, int r) {
  std::vector<int64_t> out;
  const int64_t c = S / (2 * P);
  for (int64_t i = 0; i < c; ++i) out.push_back(r * c + i);
  for (int64_t i = 0; i < c; ++i) out.push_back((2 * P - 1 - r) * c + i);
  return out;
}

std::vector<int64_t> striped(int64_t S, int P, int r) {
  std::vector<int64_t> out;
  for (int64_t t = r; t < S; t += P) out.push_back(t);
  return out;
}

std::vector<int64_t> usp(int64_t S, int ring, int ulysses, int r) {
  const int j = r / ulysses, u = r % ulysses;
  const std::vector<int64_t> shard = zigzag(S, ring, j);
  const int64_t c = S / (2 * ring), piece = c / ulysses;
  std::vector<int64_t> out;
  for (int half = 0; half < 2; ++half)
    for (int64_t i = 0; i < piece; ++i) out.push_back(shard[half * c + u * piece + i]);
  return out;
}

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

}  // namespace minicp::layout
