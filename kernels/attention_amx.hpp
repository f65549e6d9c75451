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
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "kernels/amx_tiles.hpp"
#include "kernels/attention_tiled.hpp"

namespace minicp::kernels::detail::tiled::MINICP_AMX_NS {

inline int round_up(int n, int m) { return (n + m - 1) / m * m; }

// A [M, K] row-major bf16, zero past M (to a multiple of 16 rows) and K (of 32). shape()
// zeroes only the padding: the packing functions write every entry inside [M, K].
struct OperandA {
  std::vector<bf16> v;
  int ld = 0;  // bf16 per row
  bf16* shape(int M, int K) {
    ld = round_up(std::max(K, 1), amx::kTileK);
    const int rows = round_up(std::max(M, 1), amx::kTileRows);
    if (v.size() < size_t(rows) * ld) v.resize(size_t(rows) * ld);
    bf16* a = v.data();
    if (ld > K)
      for (int m = 0; m < M; ++m) std::memset(static_cast<void*>(a + size_t(m) * ld + K), 0, (ld - K) * sizeof(bf16));
    std::memset(static_cast<void*>(a + size_t(M) * ld), 0, size_t(rows - M) * ld * sizeof(bf16));
    return a;
  }
};
// B [K, N] in pair rows: word (p, n) = B[2p][n] | B[2p+1][n] << 16, zero past K (to a
// multiple of 32) and N (of 16). shape() zeroes only the padding, as OperandA's does.
struct OperandB {
  std::vector<uint32_t> w;
  int ld = 0, pairs = 0;  // words per pair row; pair rows
  uint32_t* shape(int K, int N) {
    ld = round_up(std::max(N, 1), amx::kTileN), pairs = round_up(std::max(K, 1), amx::kTileK) / 2;
    if (w.size() < size_t(pairs) * ld) w.resize(size_t(pairs) * ld);
    uint32_t* b = w.data();
    const int written = (K + 1) / 2;  // pair rows the packing writes (an odd K's last one half zero)
    if (ld > N)
      for (int p = 0; p < written; ++p) std::memset(b + size_t(p) * ld + N, 0, (ld - N) * sizeof(uint32_t));
    std::memset(b + size_t(written) * ld, 0, size_t(pairs - written) * ld * sizeof(uint32_t));
    return b;
  }
};

// The packing below is exact (copies, transposes, round-to-nearest-even), so its loop order
// changes no bit; the transposes walk 16 x 16 blocks, which stay in L1 on both sides.
constexpr int kPackBlock = 16;

// A <- X [M, K] (row stride ldx), as it lies.
inline void a_rows(OperandA& a, const bf16* X, std::ptrdiff_t ldx, int M, int K) {
  bf16* out = a.shape(M, K);
  for (int m = 0; m < M; ++m) std::memcpy(static_cast<void*>(out + size_t(m) * a.ld), X + m * ldx, K * sizeof(bf16));
}
// A <- S [M, K] (row stride lds) rounded to bf16.
inline void a_rounded(OperandA& a, const float* S, std::ptrdiff_t lds, int M, int K) {
  bf16* out = a.shape(M, K);
  for (int m = 0; m < M; ++m) {
    const float* s = S + m * lds;
    uint16_t* o = &out[size_t(m) * a.ld].bits;
    for (int k = 0; k < K; ++k) o[k] = bf16::round(s[k]);
  }
}
#ifdef __AVX512F__
// 16 x 16 fp32 at S (row stride lds) rounded to bf16 as bf16::round rounds (to nearest even, a
// NaN kept quiet) and transposed: row c of out (stride ldo) gets column c of S. The network of
// unpacks and 128-bit shuffles transposes 32-bit lanes in registers; 16 x 16 scalar loads and
// stores cost about ten times as much.
inline void round_transpose_16x16(const float* S, std::ptrdiff_t lds, uint16_t* out, std::ptrdiff_t ldo) {
  const __m512i exp = _mm512_set1_epi32(0x7f800000), man = _mm512_set1_epi32(0x007fffff);
  const __m512i half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(0x40);
  // Every lane shift, unpack and shuffle in its zero-masked form with all lanes kept: the
  // same instructions, without the undefined source GCC 12's plain forms warn of.
  const __mmask16 k32 = 0xffff;
  const __mmask8 k64 = 0xff;
  auto high = [k32](__m512i x) { return _mm512_maskz_srli_epi32(k32, x, 16); };
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) {
    const __m512i u = _mm512_loadu_si512(S + i * lds);
    const __m512i even = _mm512_add_epi32(half, _mm512_and_si512(high(u), one));
    const __mmask16 nan = _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, exp), exp) & _mm512_test_epi32_mask(u, man);
    r[i] = _mm512_mask_or_epi32(high(_mm512_add_epi32(u, even)), nan, high(u), quiet);
  }
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_maskz_unpacklo_epi32(k32, r[i], r[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_epi32(k32, r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_maskz_unpacklo_epi64(k64, t[i], t[i + 2]);
    r[i + 1] = _mm512_maskz_unpackhi_epi64(k64, t[i], t[i + 2]);
    r[i + 2] = _mm512_maskz_unpacklo_epi64(k64, t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_maskz_unpackhi_epi64(k64, t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_maskz_shuffle_i32x4(k32, r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_maskz_shuffle_i32x4(k32, r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_maskz_shuffle_i32x4(k32, r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_maskz_shuffle_i32x4(k32, r[i + 8], r[i + 12], 0xdd);
  }
  auto store = [&](int c, __m512i x) {  // column c's 16 words, narrowed to 16 bf16
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c * ldo), _mm512_maskz_cvtepi32_epi16(k32, x));
  };
  for (int i = 0; i < 8; ++i) {
    store(i, _mm512_maskz_shuffle_i32x4(k32, t[i], t[i + 8], 0x88));
    store(i + 8, _mm512_maskz_shuffle_i32x4(k32, t[i], t[i + 8], 0xdd));
  }
}
#endif

// A <- S^T rounded to bf16, for S [rows, cols] (row stride lds): A is [cols, rows].
inline void a_rounded_transposed(OperandA& a, const float* S, std::ptrdiff_t lds, int rows, int cols) {
  bf16* out = a.shape(cols, rows);
  for (int r0 = 0; r0 < rows; r0 += kPackBlock)
    for (int c0 = 0; c0 < cols; c0 += kPackBlock) {
      const int r1 = std::min(rows, r0 + kPackBlock), c1 = std::min(cols, c0 + kPackBlock);
#ifdef __AVX512F__
      if (r1 - r0 == 16 && c1 - c0 == 16) {
        round_transpose_16x16(S + r0 * lds + c0, lds, &out[size_t(c0) * a.ld + r0].bits, a.ld);
        continue;
      }
#endif
      for (int c = c0; c < c1; ++c) {
        uint16_t* o = &out[size_t(c) * a.ld].bits;
        for (int r = r0; r < r1; ++r) o[r] = bf16::round(S[r * lds + c]);
      }
    }
}
// B <- X [K, N] (row stride ldx), in pair rows: two rows of X interleaved per pair row.
inline void b_rows(OperandB& b, const bf16* X, std::ptrdiff_t ldx, int K, int N) {
  uint32_t* out = b.shape(K, N);
  for (int p = 0; p < K / 2; ++p) {
    const uint16_t *lo = &X[2 * p * ldx].bits, *hi = &X[(2 * p + 1) * ldx].bits;
    uint32_t* o = out + size_t(p) * b.ld;
    for (int n = 0; n < N; ++n) o[n] = uint32_t(lo[n]) | uint32_t(hi[n]) << 16;
  }
  if (K % 2) {  // the last pair row's high halves are zero
    const uint16_t* lo = &X[(K - 1) * ldx].bits;
    uint32_t* o = out + size_t(K / 2) * b.ld;
    for (int n = 0; n < N; ++n) o[n] = lo[n];
  }
}
// B <- X^T in pair rows, for X [N, K] (row stride ldx): word (p, n) is X[n][2p], X[n][2p+1],
// the two bf16 that lie next to each other in X's row n: a transpose of 32-bit words.
inline void b_transposed(OperandB& b, const bf16* X, std::ptrdiff_t ldx, int N, int K) {
  uint32_t* out = b.shape(K, N);
  const int P = K / 2;  // whole pairs
  for (int n0 = 0; n0 < N; n0 += kPackBlock)
    for (int p0 = 0; p0 < P; p0 += kPackBlock) {
      const int n1 = std::min(N, n0 + kPackBlock), p1 = std::min(P, p0 + kPackBlock);
      for (int p = p0; p < p1; ++p) {
        uint32_t* o = out + size_t(p) * b.ld;
        for (int n = n0; n < n1; ++n) std::memcpy(o + n, X + n * ldx + 2 * p, sizeof(uint32_t));
      }
    }
  if (K % 2)  // the last pair row: X[n][K-1] alone
    for (int n = 0; n < N; ++n) out[size_t(P) * b.ld + n] = X[n * ldx + K - 1].bits;
}

// One block of MB x NB tiles of C at (m0, n0): C (+)= A B over every k step, written back
// for m < M, n < N (accumulate: added to C; else alpha times the product). Whole tiles are
// loaded from and stored to C where it lies (a tile load takes any row stride); a block at
// a ragged edge goes through a zero-padded copy.
template <class Tiles, int MB, int NB>
void block(int m0, int n0, int M, int N, const OperandA& A, const OperandB& B, float* C, std::ptrdiff_t ldc,
           bool accumulate, float alpha) {
  constexpr int R = amx::kTileRows, W = amx::kTileN;
  alignas(64) float c[4][R][W];
  auto rows = [&](int i) { return std::clamp(M - m0 - i * R, 0, R); };
  auto cols = [&](int j) { return std::clamp(N - n0 - j * W, 0, W); };
  const bool whole = M - m0 >= MB * R && N - n0 >= NB * W;
  const std::ptrdiff_t stride = std::ptrdiff_t(sizeof(float)) * (whole ? ldc : W);
  auto tile = [&](int i, int j) { return whole ? C + (m0 + i * R) * ldc + n0 + j * W : c[2 * i + j][0]; };
  if (accumulate) {
    if (!whole) {
      std::memset(c, 0, sizeof c);
      for (int i = 0; i < MB; ++i)
        for (int j = 0; j < NB; ++j)
          for (int r = 0; r < rows(i); ++r)
            std::memcpy(c[2 * i + j][r], C + (m0 + i * R + r) * ldc + n0 + j * W, cols(j) * sizeof(float));
    }
    Tiles::template load<0>(tile(0, 0), stride);
    if constexpr (NB == 2) Tiles::template load<1>(tile(0, 1), stride);
    if constexpr (MB == 2) Tiles::template load<2>(tile(1, 0), stride);
    if constexpr (MB == 2 && NB == 2) Tiles::template load<3>(tile(1, 1), stride);
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
  Tiles::template store<0>(tile(0, 0), stride);
  if constexpr (NB == 2) Tiles::template store<1>(tile(0, 1), stride);
  if constexpr (MB == 2) Tiles::template store<2>(tile(1, 0), stride);
  if constexpr (MB == 2 && NB == 2) Tiles::template store<3>(tile(1, 1), stride);
  const float scale = accumulate ? 1.0f : alpha;
  if (whole && scale == 1.0f) return;
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j)
      for (int r = 0; r < rows(i); ++r) {
        float* out = C + (m0 + i * R + r) * ldc + n0 + j * W;
        const float* in = whole ? out : c[2 * i + j][r];
        for (int n = 0; n < cols(j); ++n) out[n] = scale * in[n];
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

  // The operands' buffers are the thread's, kept from work item to item (as the loops' own,
  // item_buffer): one engine of a kind lives on a thread at a time.
  struct FwdOperands {
    OperandA a;
    OperandB qT, b;
  };
  struct BwdOperands {
    OperandA a;
    OperandB kT, vT, kp, b;
  };
  template <class W>
  static W& thread_operands() {
    thread_local W w;
    return w;
  }

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
    FwdOperands& w_ = thread_operands<FwdOperands>();
    OperandA& a_ = w_.a;
    OperandB &qT_ = w_.qT, &b_ = w_.b;
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
    BwdOperands& w_ = thread_operands<BwdOperands>();
    OperandA& a_ = w_.a;
    OperandB &kT_ = w_.kT, &vT_ = w_.vT, &kp_ = w_.kp, &b_ = w_.b;
  };
};

}  // namespace minicp::kernels::detail::tiled::MINICP_AMX_NS
