// Plain fp64 references for the kernel tests: materialised S x S attention, textbook
// RMSNorm/RoPE/SwiGLU, naive GEMM. Written independently of kernels/ (own mask rule).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace minicp::ref {

using Vec = std::vector<double>;

// Deterministic value in [-1, 1) from (seed, index): a splitmix64 hash.
inline double hash_uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}
inline Vec random_vec(size_t n, uint64_t seed, double amp = 1.0) {
  Vec v(n);
  for (size_t i = 0; i < n; ++i) v[i] = amp * hash_uniform(seed, i);
  return v;
}

struct Mask {
  std::vector<int64_t> qpos, kpos;
  std::vector<int32_t> qdoc, kdoc;  // empty: one document
  bool causal = true;
  int64_t window = 0;
  bool visible(size_t i, size_t j) const {
    const int64_t qp = qpos[i], kp = kpos[j];
    const bool is_causal = causal || window > 0;
    if (is_causal && !(kp <= qp)) return false;
    if (window > 0 && !(kp > qp - window)) return false;
    if (!qdoc.empty() && qdoc[i] != kdoc[j]) return false;
    return true;
  }
};

// C[M,N] = op(A) op(B), row-major.
inline Vec gemm(bool ta, bool tb, int M, int N, int K, const Vec& A, const Vec& B) {
  Vec C(size_t(M) * N, 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k)
        s += (ta ? A[size_t(k) * M + i] : A[size_t(i) * K + k]) * (tb ? B[size_t(j) * K + k] : B[size_t(k) * N + j]);
      C[size_t(i) * N + j] = s;
    }
  return C;
}

struct AttnOut {
  Vec o, lse;
};

// q[Sq,H,D], k,v[Sk,Hkv,D] -> o[Sq,H,D], lse[Sq,H]. Plain softmax over the visible keys.
inline AttnOut attention_fwd(const Vec& q, const Vec& k, const Vec& v, int Sq, int Sk, int H, int Hkv, int D,
                             const Mask& m, double scale) {
  AttnOut out{Vec(size_t(Sq) * H * D, 0.0), Vec(size_t(Sq) * H, 0.0)};
  const int group = H / Hkv;
  for (int i = 0; i < Sq; ++i)
    for (int h = 0; h < H; ++h) {
      const int g = h / group;
      std::vector<double> s(Sk, -std::numeric_limits<double>::infinity());
      double mx = -std::numeric_limits<double>::infinity();
      for (int j = 0; j < Sk; ++j) {
        if (!m.visible(i, j)) continue;
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += q[(size_t(i) * H + h) * D + d] * k[(size_t(j) * Hkv + g) * D + d];
        s[j] = dot * scale;
        mx = std::max(mx, s[j]);
      }
      if (mx == -std::numeric_limits<double>::infinity()) {
        out.lse[size_t(i) * H + h] = mx;
        continue;
      }
      double sum = 0;
      for (int j = 0; j < Sk; ++j) sum += std::exp(s[j] - mx);
      for (int j = 0; j < Sk; ++j) {
        const double p = std::exp(s[j] - mx) / sum;
        for (int d = 0; d < D; ++d) out.o[(size_t(i) * H + h) * D + d] += p * v[(size_t(j) * Hkv + g) * D + d];
      }
      out.lse[size_t(i) * H + h] = mx + std::log(sum);
    }
  return out;
}

// x[S,N], w[N] -> y[S,N]
inline Vec rmsnorm(const Vec& x, const Vec& w, int S, int N, double eps) {
  Vec y(x.size());
  for (int s = 0; s < S; ++s) {
    double ss = 0;
    for (int n = 0; n < N; ++n) ss += x[size_t(s) * N + n] * x[size_t(s) * N + n];
    const double r = 1.0 / std::sqrt(ss / N + eps);
    for (int n = 0; n < N; ++n) y[size_t(s) * N + n] = x[size_t(s) * N + n] * r * w[n];
  }
  return y;
}

// x[S,H,D] rotated at positions pos[S] (rotate-half pairs i, i+D/2).
inline Vec rope(const Vec& x, const std::vector<int64_t>& pos, int S, int H, int D, double theta) {
  Vec y(x.size());
  const int half = D / 2;
  for (int s = 0; s < S; ++s)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < half; ++i) {
        const double ang = double(pos[s]) * std::pow(theta, -2.0 * i / D);
        const size_t b = (size_t(s) * H + h) * D;
        y[b + i] = x[b + i] * std::cos(ang) - x[b + i + half] * std::sin(ang);
        y[b + i + half] = x[b + i + half] * std::cos(ang) + x[b + i] * std::sin(ang);
      }
  return y;
}

inline Vec swiglu(const Vec& a, const Vec& b) {
  Vec y(a.size());
  for (size_t i = 0; i < a.size(); ++i) y[i] = a[i] / (1.0 + std::exp(-a[i])) * b[i];
  return y;
}

// max |a-b| / max(1, max |b|)
inline double rel_err(const Vec& a, const Vec& b) {
  double e = 0, mb = 1.0;
  for (size_t i = 0; i < a.size(); ++i) {
    e = std::max(e, std::abs(a[i] - b[i]));
    mb = std::max(mb, std::abs(b[i]));
  }
  return e / mb;
}

}  // namespace minicp::ref
