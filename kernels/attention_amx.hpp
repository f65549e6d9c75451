// Internal: the bf16 tiled attention's AMX engine (attention_tiled.hpp's engine contract),
// written against the tile interface of amx_tiles.hpp and instantiated twice: on the
// intrinsics (attention_amx.cpp) and on their exact emulation (attention_amx_emulated.cpp).
// Each includer defines MINICP_AMX_NS, the namespace its instantiation lives in, so the two
// never share a symbol.
//
// Every product is C (+)= A B on whole tiles: A row-major bf16 (K contiguous), B in pair
// rows (amx_tiles.hpp), both copied into zero-padded buffers (16 rows, 32 k, 16 columns), so
// ragged tiles, odd K and any row stride run the same tile loop. C blocks are 2 x 2 tiles
// (registers 0-3), with two A tiles (4, 5) and two B tiles (6, 7) per k step. As in the
// AVX512-BF16 engine, P and dS are rounded to bf16 before their products; the scores,
// softmax statistics, LSE and every accumulator stay fp32.
#pragma once
#ifndef MINICP_AMX_NS
#error "define MINICP_AMX_NS (the instantiation's namespace) before including attention_amx.hpp"
#endif
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/amx_tiles.hpp"
#include "kernels/attention_tiled.hpp"

namespace minicp::kernels::detail::tiled::MINICP_AMX_NS {

inline int round_up(int n, int m) { return (n + m - 1) / m * m; }

// A [M, K] row-major bf16, zero past M (to a multiple of 16 rows) and K (of 32).
struct OperandA {
  std::vector<bf16> v;
  int ld = 0;  // bf16 per row
  bf16* shape(int M, int K) {
    ld = round_up(std::max(K, 1), amx::kTileK);
    const size_t n = size_t(round_up(std::max(M, 1), amx::kTileRows)) * ld;
    if (v.size() < n) v.resize(n);
    std::memset(static_cast<void*>(v.data()), 0, n * sizeof(bf16));
    return v.data();
  }
};
// B [K, N] in pair rows: word (p, n) = B[2p][n] | B[2p+1][n] << 16, zero past K (to a
// multiple of 32) and N (of 16).
struct OperandB {
  std::vector<uint32_t> w;
  int ld = 0, pairs = 0;  // words per pair row; pair rows
  uint32_t* shape(int K, int N) {
    ld = round_up(std::max(N, 1), amx::kTileN), pairs = round_up(std::max(K, 1), amx::kTileK) / 2;
    const size_t n = size_t(pairs) * ld;
    if (w.size() < n) w.resize(n);
    std::memset(w.data(), 0, n * sizeof(uint32_t));
    return w.data();
  }
};

// A <- X [M, K] (row stride ldx), as it lies.
inline void a_rows(OperandA& a, const bf16* X, std::ptrdiff_t ldx, int M, int K) {
  bf16* out = a.shape(M, K);
  for (int m = 0; m < M; ++m) std::memcpy(static_cast<void*>(out + size_t(m) * a.ld), X + m * ldx, K * sizeof(bf16));
}
// A <- S [M, K] (row stride lds) rounded to bf16.
inline void a_rounded(OperandA& a, const float* S, std::ptrdiff_t lds, int M, int K) {
  bf16* out = a.shape(M, K);
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < K; ++k) out[size_t(m) * a.ld + k] = bf16(S[m * lds + k]);
}
// A <- S^T rounded to bf16, for S [rows, cols] (row stride lds): A is [cols, rows].
inline void a_rounded_transposed(OperandA& a, const float* S, std::ptrdiff_t lds, int rows, int cols) {
  bf16* out = a.shape(cols, rows);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) out[size_t(c) * a.ld + r] = bf16(S[r * lds + c]);
}
inline uint32_t pair(bf16 lo, bf16 hi) { return uint32_t(lo.bits) | uint32_t(hi.bits) << 16; }
// B <- X [K, N] (row stride ldx), in pair rows.
inline void b_rows(OperandB& b, const bf16* X, std::ptrdiff_t ldx, int K, int N) {
  uint32_t* out = b.shape(K, N);
  const bf16 zero(0.0f);
  for (int p = 0; 2 * p < K; ++p)
    for (int n = 0; n < N; ++n)
      out[size_t(p) * b.ld + n] = pair(X[2 * p * ldx + n], 2 * p + 1 < K ? X[(2 * p + 1) * ldx + n] : zero);
}
// B <- X^T in pair rows, for X [N, K] (row stride ldx): word (p, n) is X[n][2p], X[n][2p+1].
inline void b_transposed(OperandB& b, const bf16* X, std::ptrdiff_t ldx, int N, int K) {
  uint32_t* out = b.shape(K, N);
  const bf16 zero(0.0f);
  for (int n = 0; n < N; ++n)
    for (int p = 0; 2 * p < K; ++p)
      out[size_t(p) * b.ld + n] = pair(X[n * ldx + 2 * p], 2 * p + 1 < K ? X[n * ldx + 2 * p + 1] : zero);
}

// One block of MB x NB tiles of C at (m0, n0): C (+)= A B over every k step, written back
// for m < M, n < N (accumulate: added to C; else alpha times the product).
template <class Tiles, int MB, int NB>
void block(int m0, int n0, int M, int N, const OperandA& A, const OperandB& B, float* C, std::ptrdiff_t ldc,
           bool accumulate, float alpha) {
  constexpr int R = amx::kTileRows, W = amx::kTileN;
  alignas(64) float c[4][R][W];
  auto rows = [&](int i) { return std::clamp(M - m0 - i * R, 0, R); };
  auto cols = [&](int j) { return std::clamp(N - n0 - j * W, 0, W); };
  if (accumulate) {
    std::memset(c, 0, sizeof c);
    for (int i = 0; i < MB; ++i)
      for (int j = 0; j < NB; ++j)
        for (int r = 0; r < rows(i); ++r)
          std::memcpy(c[2 * i + j][r], C + (m0 + i * R + r) * ldc + n0 + j * W, cols(j) * sizeof(float));
    Tiles::template load<0>(c[0], W * sizeof(float));
    if constexpr (NB == 2) Tiles::template load<1>(c[1], W * sizeof(float));
    if constexpr (MB == 2) Tiles::template load<2>(c[2], W * sizeof(float));
    if constexpr (MB == 2 && NB == 2) Tiles::template load<3>(c[3], W * sizeof(float));
  } else {
    Tiles::template zero<0>();
    if constexpr (NB == 2) Tiles::template zero<1>();
    if constexpr (MB == 2) Tiles::template zero<2>();
    if constexpr (MB == 2 && NB == 2) Tiles::template zero<3>();
  }
  const std::ptrdiff_t sa = A.ld * std::ptrdiff_t(sizeof(bf16)), sb = B.ld * std::ptrdiff_t(sizeof(uint32_t));
  for (int k = 0; k < A.ld / amx::kTileK; ++k) {
    const bf16* a = A.v.data() + size_t(m0) * A.ld + k * amx::kTileK;
    const uint32_t* b = B.w.data() + size_t(k) * R * B.ld + n0;
    Tiles::template load<4>(a, sa);
    if constexpr (MB == 2) Tiles::template load<5>(a + R * A.ld, sa);
    Tiles::template load<6>(b, sb);
    if constexpr (NB == 2) Tiles::template load<7>(b + W, sb);
    Tiles::template dpbf16ps<0, 4, 6>();
    if constexpr (NB == 2) Tiles::template dpbf16ps<1, 4, 7>();
    if constexpr (MB == 2) Tiles::template dpbf16ps<2, 5, 6>();
    if constexpr (MB == 2 && NB == 2) Tiles::template dpbf16ps<3, 5, 7>();
  }
  Tiles::template store<0>(c[0], W * sizeof(float));
  if constexpr (NB == 2) Tiles::template store<1>(c[1], W * sizeof(float));
  if constexpr (MB == 2) Tiles::template store<2>(c[2], W * sizeof(float));
  if constexpr (MB == 2 && NB == 2) Tiles::template store<3>(c[3], W * sizeof(float));
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j)
      for (int r = 0; r < rows(i); ++r) {
        float* out = C + (m0 + i * R + r) * ldc + n0 + j * W;
        for (int n = 0; n < cols(j); ++n) out[n] = accumulate ? c[2 * i + j][r][n] : alpha * c[2 * i + j][r][n];
      }
}

// C [M, N] (row stride ldc) = alpha A B, or C += A B (accumulate; alpha is then 1).
template <class Tiles>
void gemm(int M, int N, const OperandA& A, const OperandB& B, float* C, std::ptrdiff_t ldc, bool accumulate,
          float alpha = 1.0f) {
  if (A.ld != 2 * B.pairs) throw std::logic_error("amx gemm: A and B disagree on K");
  constexpr int R = amx::kTileRows, W = amx::kTileN;
  for (int m0 = 0; m0 < M; m0 += 2 * R)
    for (int n0 = 0; n0 < N; n0 += 2 * W) {
      const bool two_m = M - m0 > R, two_n = N - n0 > W;
      if (two_m && two_n)
        block<Tiles, 2, 2>(m0, n0, M, N, A, B, C, ldc, accumulate, alpha);
      else if (two_m)
        block<Tiles, 2, 1>(m0, n0, M, N, A, B, C, ldc, accumulate, alpha);
      else if (two_n)
        block<Tiles, 1, 2>(m0, n0, M, N, A, B, C, ldc, accumulate, alpha);
      else
        block<Tiles, 1, 1>(m0, n0, M, N, A, B, C, ldc, accumulate, alpha);
    }
}

// The engine. A work item configures the tiles on its thread for as long as its workspace
// lives (LDTILECFG is per thread; TILERELEASE at the end).
template <class Tiles>
struct AmxEngine {
  using In = bf16;
  using Acc = float;
  static constexpr const char* kName = Tiles::kAttnName;
  static int padded(int n) { return round_up(n, amx::kTileN); }

  struct Session {
    Session() { Tiles::configure(); }
    ~Session() { Tiles::release(); }
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;
  };

  class Fwd {
   public:
    Fwd(int D, int, int) : D_(D) {}
    void load_q(const bf16* Qt, int ldq, int mq, float scale) {
      b_transposed(qT_, Qt, ldq, mq, D_);  // [D, mq]: q_t^T
      scale_ = scale;
    }
    void scores(const bf16* Kt, int ldk, int mk, int nq, float* sT, int ld) {
      a_rows(a_, Kt, ldk, mk, D_);
      gemm<Tiles>(mk, nq, a_, qT_, sT, ld, false, scale_);
    }
    void add_pv(const float* sT, int ld, int mk, int mq, const bf16* Vt, int ldk, float* acc) {
      a_rounded_transposed(a_, sT, ld, mk, mq);  // P [mq, mk]
      b_rows(b_, Vt, ldk, mk, D_);
      gemm<Tiles>(mq, D_, a_, b_, acc, D_, true);
    }

   private:
    Session session_;
    int D_;
    float scale_ = 1.0f;
    OperandA a_;
    OperandB qT_, b_;
  };

  class Bwd {
   public:
    Bwd(int D, int, int) : D_(D) {}
    void load_k(const bf16* Kt, const bf16* Vt, int ldk, int mk, float scale) {
      b_transposed(kT_, Kt, ldk, mk, D_);  // [D, mk]: K_t^T
      b_transposed(vT_, Vt, ldk, mk, D_);  // [D, mk]: V_t^T
      b_rows(kp_, Kt, ldk, mk, D_);        // [mk, D]: K_t
      scale_ = scale;
    }
    void scores(const bf16* Qt, int ldq, int mq, int nk, float* P, int ld) {
      a_rows(a_, Qt, ldq, mq, D_);
      gemm<Tiles>(mq, nk, a_, kT_, P, ld, false, scale_);
    }
    void add_dv_and_dp(const float* P, int ld, int mq, int mk, int nk, const bf16* dOt, int ldq, float* dVt, int ldk,
                       float* dP) {
      a_rounded_transposed(a_, P, ld, mq, mk);  // P^T [mk, mq]
      b_rows(b_, dOt, ldq, mq, D_);
      gemm<Tiles>(mk, D_, a_, b_, dVt, ldk, true);
      a_rows(a_, dOt, ldq, mq, D_);
      gemm<Tiles>(mq, nk, a_, vT_, dP, ld, false);
    }
    void add_dk_and_dq(const float* dS, int ld, int mq, int mk, const bf16* Qt, int ldq, float* dKt, int ldk,
                       float* dQt) {
      a_rounded_transposed(a_, dS, ld, mq, mk);  // dS^T [mk, mq]
      b_rows(b_, Qt, ldq, mq, D_);
      gemm<Tiles>(mk, D_, a_, b_, dKt, ldk, true);
      a_rounded(a_, dS, ld, mq, mk);  // dS [mq, mk]
      gemm<Tiles>(mq, D_, a_, kp_, dQt, ldq, true);
    }

   private:
    Session session_;
    int D_;
    float scale_ = 1.0f;
    OperandA a_;
    OperandB kT_, vT_, kp_, b_;
  };
};

}  // namespace minicp::kernels::detail::tiled::MINICP_AMX_NS
