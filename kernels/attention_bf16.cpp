// bf16 tiled attention on AVX512-BF16: the loops of attention_tiled.hpp (tiles, masks,
// online softmax in fp32) with Q, K, V and dOut tiles kept in bf16 and every tile product a
// bf16 pair dot product (vdpbf16ps) accumulated in fp32. P and dS are rounded to bf16 before
// their products, as FlashAttention does; the scores, softmax statistics, LSE and all
// accumulators stay fp32. Only the functions marked MINICP_AVX512BF16 use the extension, so
// the file builds for any x86-64 target, and they run only where attention_isa()
// (attention.cpp) says the CPU has it. A host build's alone (kernels/CMakeLists.txt). Intel's AMX
// tiles run the same loops in attention_amx.cpp.
#include <cstring>

#include "kernels/attention_tiled.hpp"

#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 9 : (defined(__GNUC__) && __GNUC__ >= 10))
#define MINICP_HAVE_AVX512BF16 1
#include <immintrin.h>
#define MINICP_AVX512BF16 __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl")))
#endif

#ifdef MINICP_HAVE_AVX512BF16
namespace minicp::kernels::detail::tiled {
namespace {
namespace dot {

// Register block: kMR rows x kNV zmm of C (24 of the 32 zmm), as tile_gemm.hpp's.
constexpr int kLanes = 16, kMR = 6, kNV = 4;
constexpr int kNB = kNV * kLanes;  // columns of one packed panel
int padded(int n) { return (n + kNB - 1) / kNB * kNB; }

// Packed B [K, N] (vdpbf16ps's operand layout): panels of kNB columns one after the other; in
// a panel, pair row p is kNB 4-byte words, word c holding B[2p][c] (low half) and B[2p+1][c]
// (high half). Zero past K and N. Sizes are in bf16 elements.
size_t packed_size(int K, int N) { return size_t(2) * ((K + 1) / 2) * padded(N); }

// The first n of 16 lanes.
inline __mmask16 lanes(int n) {
  return n >= kLanes ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// A is read a word at a time: A[m, 2p] and A[m, 2p+1] adjacent, at A + m * ars + p * aks.
MINICP_AVX512BF16 inline __m512bh broadcast_pair(const bf16* p) {
  int32_t w;
  std::memcpy(&w, p, sizeof w);
  return (__m512bh)_mm512_set1_epi32(w);
}

// One MR x NV-vector block of C over KP pairs of k; the last vector stores the lanes in tail.
template <int MR, int NV>
MINICP_AVX512BF16 inline void block(int KP, const bf16* A, ptrdiff_t ars, ptrdiff_t aks, const bf16* B, float* C,
                                    ptrdiff_t ldc, __mmask16 tail, bool accumulate, float alpha) {
  __m512 c[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      c[r][v] = accumulate ? _mm512_maskz_loadu_ps(v == NV - 1 ? tail : 0xffff, C + r * ldc + v * kLanes)
                           : _mm512_setzero_ps();
  for (int p = 0; p < KP; ++p) {
    __m512bh b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) b[v] = (__m512bh)_mm512_loadu_si512(B + 2 * (size_t(p) * kNB + v * kLanes));
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512bh a = broadcast_pair(A + r * ars + p * aks);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], a, b[v]);
    }
  }
  const __m512 scale = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      _mm512_mask_storeu_ps(C + r * ldc + v * kLanes, v == NV - 1 ? tail : 0xffff,
                            accumulate ? c[r][v] : _mm512_mul_ps(c[r][v], scale));
}

// All M rows of one panel: whole kMR blocks, then one smaller block.
template <int NV>
MINICP_AVX512BF16 void panel(int M, int KP, const bf16* A, ptrdiff_t ars, ptrdiff_t aks, const bf16* B, float* C,
                             ptrdiff_t ldc, __mmask16 tail, bool accumulate, float alpha) {
  static_assert(kMR == 6, "the remainder switch below lists the block heights 1..5");
  int m = 0;
  for (; m + kMR <= M; m += kMR)
    block<kMR, NV>(KP, A + m * ars, ars, aks, B, C + m * ldc, ldc, tail, accumulate, alpha);
  const bf16* Am = A + m * ars;
  float* Cm = C + m * ldc;
  switch (M - m) {
    case 5: block<5, NV>(KP, Am, ars, aks, B, Cm, ldc, tail, accumulate, alpha); break;
    case 4: block<4, NV>(KP, Am, ars, aks, B, Cm, ldc, tail, accumulate, alpha); break;
    case 3: block<3, NV>(KP, Am, ars, aks, B, Cm, ldc, tail, accumulate, alpha); break;
    case 2: block<2, NV>(KP, Am, ars, aks, B, Cm, ldc, tail, accumulate, alpha); break;
    case 1: block<1, NV>(KP, Am, ars, aks, B, Cm, ldc, tail, accumulate, alpha); break;
    default: break;
  }
}

// C[m, n] = alpha * sum_k A[m, k] B[k, n] (accumulate: C[m, n] += the sum; alpha is then 1)
// for m < M, n < N, with B packed. An odd K needs A[m, K] finite (it meets B's zero row).
MINICP_AVX512BF16 void gemm(int M, int N, int K, const bf16* A, ptrdiff_t ars, ptrdiff_t aks, const bf16* Bp, float* C,
                            ptrdiff_t ldc, bool accumulate, float alpha = 1.0f) {
  const int KP = (K + 1) / 2;
  for (int n = 0; n < N; n += kNB) {
    const int w = std::min(kNB, N - n), nv = (w + kLanes - 1) / kLanes;
    const __mmask16 tail = lanes(w - (nv - 1) * kLanes);
    const bf16* B = Bp + size_t(2) * n * KP;
    switch (nv) {
      case 4: panel<4>(M, KP, A, ars, aks, B, C + n, ldc, tail, accumulate, alpha); break;
      case 3: panel<3>(M, KP, A, ars, aks, B, C + n, ldc, tail, accumulate, alpha); break;
      case 2: panel<2>(M, KP, A, ars, aks, B, C + n, ldc, tail, accumulate, alpha); break;
      default: panel<1>(M, KP, A, ars, aks, B, C + n, ldc, tail, accumulate, alpha); break;
    }
  }
}

// 16 words from two rows of 16 bf16: (lo[c], hi[c]). (The maskz forms: GCC 12 warns that the
// unmasked ones read an uninitialised register.)
MINICP_AVX512BF16 inline __m512i interleave(__m256i lo, __m256i hi) {
  const __mmask16 all = 0xffff;
  return _mm512_or_si512(_mm512_maskz_cvtepu16_epi32(all, lo),
                         _mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, hi), 16));
}

// Bp <- B [K, N] (row stride ldb), packed: rows 2p and 2p+1 interleaved.
MINICP_AVX512BF16 void pack(int K, int N, const bf16* B, ptrdiff_t ldb, bf16* Bp) {
  const int KP = (K + 1) / 2;
  for (int n = 0; n < padded(N); n += kNB)
    for (int p = 0; p < KP; ++p) {
      const bf16* r0 = B + 2 * p * ldb + n;
      bf16* out = Bp + size_t(2) * (size_t(n) * KP + size_t(p) * kNB);
      for (int c = 0; c < kNB; c += kLanes) {
        const __mmask16 m = lanes(N - n - c);
        const __m256i lo = _mm256_maskz_loadu_epi16(m, r0 + c);
        const __m256i hi = 2 * p + 1 < K ? _mm256_maskz_loadu_epi16(m, r0 + ldb + c) : _mm256_setzero_si256();
        _mm512_storeu_si512(out + 2 * c, interleave(lo, hi));
      }
    }
}

// Bp <- X^T packed, for X [N, K] (row stride ldx): word (p, n) is X[n][2p], X[n][2p+1], two
// adjacent entries. Once per q-tile (forward) or k-tile (backward), so plain loops.
void pack_transposed(int K, int N, const bf16* X, ptrdiff_t ldx, bf16* Bp) {
  const int KP = (K + 1) / 2;
  std::memset(static_cast<void*>(Bp), 0, packed_size(K, N) * sizeof(bf16));
  for (int n = 0; n < N; ++n) {
    bf16* out = Bp + size_t(2) * (size_t(n / kNB * kNB) * KP + n % kNB);
    for (int k = 0; k < K; ++k) out[size_t(2) * (k / 2) * kNB + k % 2] = X[n * ldx + k];
  }
}

// out <- S [rows, cols] (row stride lds) rounded to bf16 with rows 2p and 2p+1 interleaved,
// word (p, c) at out + 2 * (p * ldo + c): the A operand of a product over the rows. A missing
// row 2p+1 reads 0.
MINICP_AVX512BF16 void round_pairs(const float* S, ptrdiff_t lds, int rows, int cols, bf16* out, ptrdiff_t ldo) {
  for (int p = 0; p < (rows + 1) / 2; ++p) {
    const float* s0 = S + 2 * p * lds;
    for (int c = 0; c < cols; c += kLanes) {
      const __mmask16 m = lanes(cols - c);
      const __m512 x0 = _mm512_maskz_loadu_ps(m, s0 + c);
      const __m512 x1 = 2 * p + 1 < rows ? _mm512_maskz_loadu_ps(m, s0 + lds + c) : _mm512_setzero_ps();
      const __m512i w = interleave((__m256i)_mm512_cvtneps_pbh(x0), (__m256i)_mm512_cvtneps_pbh(x1));
      _mm512_mask_storeu_epi32(out + 2 * (p * ldo + c), m, w);
    }
  }
}

// out <- S [rows, cols] rounded to bf16, row by row (row stride ldo), with a 0 after an odd
// row's last entry: the A operand of a product over the columns.
MINICP_AVX512BF16 void round_rows(const float* S, ptrdiff_t lds, int rows, int cols, bf16* out, ptrdiff_t ldo) {
  const int even = cols + (cols & 1);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < even; c += kLanes) {
      const __m512 x = _mm512_maskz_loadu_ps(lanes(cols - c), S + r * lds + c);
      _mm256_mask_storeu_epi16(out + r * ldo + c, lanes(even - c), (__m256i)_mm512_cvtneps_pbh(x));
    }
}

}  // namespace dot

// The bf16 engine of attention_tiled.hpp. The softmax scale multiplies the fp32 scores (a
// bf16 copy of scale * q would round a second time).
struct Bf16Engine {
  using In = bf16;
  using Acc = float;
  static constexpr const char* kName = "_bf16";
  static int padded(int n) { return dot::padded(n); }

  class Fwd {
   public:
    Fwd(int D, int bq, int bk)
        : D_(D),
          qT_(dot::packed_size(D, bq)),
          vp_(dot::packed_size(bk, D)),
          pT_(size_t(2) * ((bk + 1) / 2) * padded(bq)) {}
    void load_q(const bf16* Qt, int ldq, int mq, float scale) {
      dot::pack_transposed(D_, mq, Qt, ldq, qT_.data());  // [D, ld]: q_t^T
      scale_ = scale;
    }
    void scores(const bf16* Kt, int ldk, int mk, int nq, float* sT, int ld) {
      dot::gemm(mk, nq, D_, Kt, ldk, 2, qT_.data(), sT, ld, false, scale_);
    }
    void add_pv(const float* sT, int ld, int mk, int mq, const bf16* Vt, int ldk, float* acc) {
      dot::round_pairs(sT, ld, mk, mq, pT_.data(), ld);  // P^T, keys in pairs
      dot::pack(mk, D_, Vt, ldk, vp_.data());
      dot::gemm(mq, D_, mk, pT_.data(), 2, 2 * ld, vp_.data(), acc, D_, true);
    }

   private:
    int D_;
    float scale_ = 1.0f;
    std::vector<bf16> qT_, vp_, pT_;
  };

  class Bwd {
   public:
    Bwd(int D, int bq, int bk)
        : D_(D),
          kT_(dot::packed_size(D, bk)),
          vT_(dot::packed_size(D, bk)),
          kp_(dot::packed_size(bk, D)),
          qp_(dot::packed_size(bq, D)),
          dop_(dot::packed_size(bq, D)),
          pairs_(size_t(2) * ((bq + 1) / 2) * padded(bk)),
          rows_(size_t(bq) * padded(bk)) {}
    void load_k(const bf16* Kt, const bf16* Vt, int ldk, int mk, float scale) {
      dot::pack_transposed(D_, mk, Kt, ldk, kT_.data());  // [D, ld]: K_t^T
      dot::pack_transposed(D_, mk, Vt, ldk, vT_.data());  // [D, ld]: V_t^T
      dot::pack(mk, D_, Kt, ldk, kp_.data());             // [bk, D]: K_t
      scale_ = scale;
    }
    void scores(const bf16* Qt, int ldq, int mq, int nk, float* P, int ld) {
      dot::gemm(mq, nk, D_, Qt, ldq, 2, kT_.data(), P, ld, false, scale_);
    }
    void add_dv_and_dp(const float* P, int ld, int mq, int mk, int nk, const bf16* dOt, int ldq, float* dVt, int ldk,
                       float* dP) {
      dot::round_pairs(P, ld, mq, mk, pairs_.data(), ld);  // P^T, queries in pairs
      dot::pack(mq, D_, dOt, ldq, dop_.data());
      dot::gemm(mk, D_, mq, pairs_.data(), 2, 2 * ld, dop_.data(), dVt, ldk, true);
      dot::gemm(mq, nk, D_, dOt, ldq, 2, vT_.data(), dP, ld, false);
    }
    void add_dk_and_dq(const float* dS, int ld, int mq, int mk, const bf16* Qt, int ldq, float* dKt, int ldk,
                       float* dQt) {
      dot::round_pairs(dS, ld, mq, mk, pairs_.data(), ld);  // dS^T, queries in pairs
      dot::round_rows(dS, ld, mq, mk, rows_.data(), ld);    // dS, keys in pairs
      dot::pack(mq, D_, Qt, ldq, qp_.data());
      dot::gemm(mk, D_, mq, pairs_.data(), 2, 2 * ld, qp_.data(), dKt, ldk, true);
      dot::gemm(mq, D_, mk, rows_.data(), ld, 2, kp_.data(), dQt, ldq, true);
    }

   private:
    int D_;
    float scale_ = 1.0f;
    std::vector<bf16> kT_, vT_, kp_, qp_, dop_, pairs_, rows_;
  };
};

}  // namespace
}  // namespace minicp::kernels::detail::tiled
#endif

namespace minicp::kernels::detail {

bool bf16_tile_products(int M, int N, int K, int products) {
  if (attention_isa() == "amx") return amx_tile_products(M, N, K, products);
#ifdef MINICP_HAVE_AVX512BF16
  if (attention_isa() != "avx512_bf16") return false;
  const std::vector<bf16> a(size_t(M) * K, bf16(1.0f)), b(size_t(K) * N, bf16(0.5f));
  std::vector<bf16> bp(tiled::dot::packed_size(K, N));
  std::vector<float> c(size_t(M) * N);
  tiled::dot::pack(K, N, b.data(), N, bp.data());
  for (int p = 0; p < products; ++p) tiled::dot::gemm(M, N, K, a.data(), K, 2, bp.data(), c.data(), N, p > 0);
  return true;
#else
  (void)M, (void)N, (void)K, (void)products;
  return false;
#endif
}

template <>
AttnStats attention_fwd_tiled<bf16>(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, const AttnMask& mask,
                                    View3<float> o, View2<float> lse, float scale, int tile_q, int tile_k) {
#ifdef MINICP_HAVE_AVX512BF16
  return tiled::fwd<tiled::Bf16Engine>(q, k, v, mask, o, lse, scale, tile_q, tile_k);
#else
  (void)q, (void)k, (void)v, (void)mask, (void)o, (void)lse, (void)scale, (void)tile_q, (void)tile_k;
  throw std::logic_error("attention_fwd_tiled<bf16>: built without AVX512-BF16 support");
#endif
}

template <>
AttnStats attention_bwd_tiled<bf16>(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, CView3<bf16> o, CView2<float> lse,
                                    CView3<bf16> dout, const AttnMask& mask, View3<float> dq, View3<float> dk,
                                    View3<float> dv, float scale, int tile_q, int tile_k) {
#ifdef MINICP_HAVE_AVX512BF16
  return tiled::bwd<tiled::Bf16Engine>(q, k, v, o, lse, dout, mask, dq, dk, dv, scale, tile_q, tile_k);
#else
  (void)q, (void)k, (void)v, (void)o, (void)lse, (void)dout, (void)mask, (void)dq, (void)dk, (void)dv;
  (void)scale, (void)tile_q, (void)tile_k;
  throw std::logic_error("attention_bwd_tiled<bf16>: built without AVX512-BF16 support");
#endif
}

}  // namespace minicp::kernels::detail
