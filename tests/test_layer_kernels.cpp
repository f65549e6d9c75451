// GEMM, RMSNorm, RoPE and SwiGLU forward kernels against the fp64 references, fp32 and fp64;
// bf16 rounding and conversion, and the same kernels on bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "kernels/attention.hpp"
#include "kernels/attention_impl.hpp"
#include "kernels/ceiling.hpp"
#include "kernels/convert.hpp"
#include "kernels/fast_exp.hpp"
#include "kernels/gemm.hpp"
#include "kernels/rmsnorm.hpp"
#include "kernels/rope.hpp"
#include "kernels/swiglu.hpp"
#include "kernels/tile_gemm.hpp"
#include "tests/env_override.hpp"
#include "tests/reference.hpp"
#include "tests/view_util.hpp"

namespace {
using namespace minicp;
using ref::Vec;

template <class T>
class LayerKernels : public ::testing::Test {
 public:
  static double tol() { return std::is_same<T, float>::value ? 2e-6 : 1e-13; }
};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(LayerKernels, Scalars);

TYPED_TEST(LayerKernels, GemmAllTransposes) {
  using T = TypeParam;
  const int M = 37, N = 53, K = 29;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const Vec a = ref::random_vec(size_t(M) * K, 1), b = ref::random_vec(size_t(K) * N, 2);
      const Vec c0 = ref::random_vec(size_t(M) * N, 3);
      auto A = test::make_view<kernels::View2<T>>("A", a, ta ? K : M, ta ? M : K);
      auto B = test::make_view<kernels::View2<T>>("B", b, tb ? N : K, tb ? K : N);
      auto C = test::make_view<kernels::View2<T>>("C", c0, M, N);
      kernels::gemm<T>(ta ? kernels::Trans::T : kernels::Trans::N, tb ? kernels::Trans::T : kernels::Trans::N, 0.5, A,
                       B, 2.0, C);
      Vec want = ref::gemm(ta, tb, M, N, K, a, b);
      for (size_t i = 0; i < want.size(); ++i) want[i] = 0.5 * want[i] + 2.0 * c0[i];
      EXPECT_LE(ref::rel_err(test::to_vec(C), want), 10 * TestFixture::tol()) << "ta=" << ta << " tb=" << tb;
    }
}

TYPED_TEST(LayerKernels, GemmRejectsMismatch) {
  using T = TypeParam;
  kernels::View2<T> A("A", 4, 5), B("B", 6, 3), C("C", 4, 3);
  EXPECT_THROW(kernels::gemm<T>(kernels::Trans::N, kernels::Trans::N, 1, A, B, 0, C), std::invalid_argument);
}

TYPED_TEST(LayerKernels, RmsNorm) {
  using T = TypeParam;
  const int S = 19, N = 72;
  const Vec x = ref::random_vec(size_t(S) * N, 4, 3.0), w = ref::random_vec(N, 5);
  auto X = test::make_view<kernels::View2<T>>("x", x, S, N);
  auto W = test::make_view<kernels::View1<T>>("w", w, N);
  kernels::View2<T> Y("y", S, N);
  kernels::View1<T> R("rstd", S);
  kernels::rmsnorm_fwd<T>(X, W, 1e-5, Y, R);
  EXPECT_LE(ref::rel_err(test::to_vec(Y), ref::rmsnorm(x, w, S, N, 1e-5)), TestFixture::tol());
}

TYPED_TEST(LayerKernels, RopeAtGlobalPositions) {
  using T = TypeParam;
  const int S = 9, H = 3, D = 64;
  const std::vector<int64_t> pos = {0, 1, 7, 100, 4095, 65536, 1000003, 5, 2};  // any layout order
  const Vec x = ref::random_vec(size_t(S) * H * D, 6);
  auto X = test::make_view<kernels::View3<T>>("x", x, S, H, D);
  auto P = test::make_index_view("pos", pos);
  kernels::rope_apply<T>(X, P, 10000.0);
  EXPECT_LE(ref::rel_err(test::to_vec(X), ref::rope(x, pos, S, H, D, 10000.0)), TestFixture::tol());
  kernels::rope_apply<T>(X, P, 10000.0, /*inverse=*/true);
  EXPECT_LE(ref::rel_err(test::to_vec(X), x), 2 * TestFixture::tol()) << "inverse rotation undoes the forward";
  // theta is a parameter: another theta gives another rotation.
  auto X2 = test::make_view<kernels::View3<T>>("x2", x, S, H, D);
  kernels::rope_apply<T>(X2, P, 500000.0);
  EXPECT_LE(ref::rel_err(test::to_vec(X2), ref::rope(x, pos, S, H, D, 500000.0)), TestFixture::tol());
  EXPECT_GT(ref::rel_err(test::to_vec(X2), ref::rope(x, pos, S, H, D, 10000.0)), 1e-3);
}

TYPED_TEST(LayerKernels, RopeRejectsOddHeadDim) {
  using T = TypeParam;
  kernels::View3<T> x("x", 2, 1, 5);
  auto P = test::make_index_view("pos", std::vector<int64_t>{0, 1});
  EXPECT_THROW(kernels::rope_apply<T>(x, P, 10000.0), std::invalid_argument);
}

TYPED_TEST(LayerKernels, SwiGlu) {
  using T = TypeParam;
  const int S = 13, F = 40;
  const Vec a = ref::random_vec(size_t(S) * F, 7, 6.0), b = ref::random_vec(size_t(S) * F, 8);
  auto A = test::make_view<kernels::View2<T>>("a", a, S, F);
  auto B = test::make_view<kernels::View2<T>>("b", b, S, F);
  kernels::View2<T> Y("y", S, F);
  kernels::swiglu_fwd<T>(A, B, Y);
  EXPECT_LE(ref::rel_err(test::to_vec(Y), ref::swiglu(a, b)), 2 * TestFixture::tol());
}

}  // namespace

namespace {
// tile::gemm against a plain triple loop: A read through both strides (a matrix and its
// transpose), B at a power-of-two stride, M, N, K with every remainder (row blocks of 1..5,
// one-vector panels, scalar columns), overwrite and accumulate.
template <class T>
void check_tile_gemm(int M, int N, int K, bool a_transposed, bool accumulate) {
  const int lda = 1 + (a_transposed ? M : K), ldb = 128, ldc = N + 3;
  std::vector<T> A(size_t(lda) * (a_transposed ? K : M)), B(size_t(K) * ldb), C(size_t(M) * ldc), R;
  for (size_t i = 0; i < A.size(); ++i) A[i] = T(std::sin(0.37 * double(i)));
  for (size_t i = 0; i < B.size(); ++i) B[i] = T(std::cos(0.11 * double(i)));
  for (size_t i = 0; i < C.size(); ++i) C[i] = T(0.5 * std::sin(double(i)));
  R = C;
  const std::ptrdiff_t ars = a_transposed ? 1 : lda, aks = a_transposed ? lda : 1;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double s = accumulate ? double(R[size_t(m) * ldc + n]) : 0.0;
      for (int k = 0; k < K; ++k) s += double(A[m * ars + k * aks]) * double(B[size_t(k) * ldb + n]);
      R[size_t(m) * ldc + n] = T(s);
    }
  kernels::tile::gemm<T>(M, N, K, A.data(), ars, aks, B.data(), ldb, C.data(), ldc, accumulate);
  const double tol = (std::is_same<T, float>::value ? 2e-6 : 1e-14) * K;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < ldc; ++n) {
      const size_t i = size_t(m) * ldc + n;
      if (n >= N) {  // outside C: untouched
        ASSERT_EQ(C[i], R[i]) << "wrote past column N at m=" << m << " n=" << n;
        continue;
      }
      ASSERT_NEAR(double(C[i]), double(R[i]), tol) << "M=" << M << " N=" << N << " K=" << K << " m=" << m << " n=" << n;
    }
}

TEST(TileGemm, MatchesTripleLoop) {
  for (bool at : {false, true})
    for (bool acc : {false, true})
      for (int M : {1, 5, 6, 13, 128})
        for (int N : {1, 8, 16, 24, 64, 72, 128})
          for (int K : {1, 7, 64}) {
            check_tile_gemm<float>(M, N, K, at, acc);
            check_tile_gemm<double>(M, N, K, at, acc);
          }
}

// exp_fast (scalar and 16-lane) against std::exp: relative error, exact zero below the range.
TEST(FastExp, MatchesStdExp) {
  using minicp::kernels::exp_fast;
  double worst = 0;
  std::vector<float> xs;
  for (int i = 0; i <= 200000; ++i) xs.push_back(-87.0f + 167.0f * float(i) / 200000.0f);  // sum stays finite
  std::vector<float> v = xs;
  const float sum = minicp::kernels::exp_shift_sum(v.data(), int(v.size()), 0.0f);
  double ref_sum = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double want = std::exp(double(xs[i]));
    ref_sum += want;
    worst = std::max(worst, std::abs(double(exp_fast(xs[i])) - want) / want);
    ASSERT_EQ(v[i], exp_fast(xs[i])) << "vector and scalar paths differ at x=" << xs[i];
  }
  EXPECT_LE(worst, 4e-7);
  EXPECT_NEAR(sum / ref_sum, 1.0, 1e-5);
  EXPECT_EQ(exp_fast(-INFINITY), 0.0f);
  EXPECT_EQ(exp_fast(-100.0f), 0.0f);
  EXPECT_EQ(exp_fast(0.0f), 1.0f);
  EXPECT_NEAR(exp_fast(88.0f) / std::exp(88.0), 1.0, 4e-7);
  std::vector<float> masked(37, -INFINITY);
  EXPECT_EQ(minicp::kernels::exp_shift_sum(masked.data(), 37, 1.5f), 0.0f);
  for (float m : masked) EXPECT_EQ(m, 0.0f);
}
}  // namespace

// bf16: rounding, conversion, GEMM and the elementwise layer kernels, each against fp64 of
// the bf16-rounded inputs, with bounds from the arithmetic: the fp32 accumulation of the
// kernels (unit roundoff u = 2^-24 per operation) and the one rounding of the result to bf16
// (half an ulp: at most 2^-8 of its magnitude).
namespace {
using kernels::bf16;
constexpr double kU32 = 0x1p-24;

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
bf16 bf16_from_bits(uint16_t b) {
  bf16 x;
  x.bits = b;
  return x;
}
bool bf16_is_nan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0; }

// d rounded to bf16 to nearest even, by arithmetic on the significand (independent of the
// kernels' bit manipulation): 8 significant bits, subnormals on the fixed 2^-133 grid,
// beyond the largest finite value (or at its halfway point to 2^128) infinity.
uint16_t ref_bf16_bits(double d) {
  if (std::isnan(d)) return 0x7fc0;
  const uint16_t sign = std::signbit(d) ? 0x8000 : 0;
  const double a = std::fabs(d);
  if (std::isinf(a)) return sign | 0x7f80;
  // a = m 2^e with m in [0.5, 1): bf16 values near a lie on the grid 2^(e-8) (or 2^-133
  // for subnormals); nearbyint rounds to it, ties to even.
  int e = 0;
  std::frexp(a, &e);
  const int scale = std::max(e - 8, -133);
  const double r = std::nearbyint(std::ldexp(a, -scale)) * std::ldexp(1.0, scale);
  if (r >= 0x1p128) return sign | 0x7f80;
  return uint16_t(sign | (f32_bits(float(r)) >> 16));  // r is a bf16, exact in float
}

// Half an ulp of bf16 at magnitude |v| (an upper bound on the error of rounding v).
double bf16_half_ulp(double v) {
  int e = 0;
  std::frexp(std::fabs(v), &e);
  return std::ldexp(1.0, std::max(e - 9, -134));
}

TEST(Bf16Rounding, EdgeCases) {
  struct Case {
    uint32_t in;
    uint16_t out;
    const char* what;
  };
  const Case cases[] = {
      {0x3f800000, 0x3f80, "1 exact"},
      {0x3f808000, 0x3f80, "1 + 2^-8: tie, to the even 1"},
      {0x3f818000, 0x3f82, "1 + 3 2^-8: tie, to the even 1 + 2^-6"},
      {0x3f808001, 0x3f81, "just above a tie rounds up"},
      {0x3f807fff, 0x3f80, "just below a tie rounds down"},
      {0xbf818000, 0xbf82, "ties to even, negative"},
      {0x7f7fffff, 0x7f80, "FLT_MAX overflows to +inf"},
      {0xff7fffff, 0xff80, "-FLT_MAX overflows to -inf"},
      {0x7f7f7fff, 0x7f7f, "below the halfway point to 2^128 stays the largest bf16"},
      {0x7f7f8000, 0x7f80, "the halfway point to 2^128 rounds to inf (even)"},
      {0x7f800000, 0x7f80, "+inf"},
      {0xff800000, 0xff80, "-inf"},
      {0x80000000, 0x8000, "-0 keeps its sign"},
      {0x00000000, 0x0000, "+0"},
      {0x80000001, 0x8000, "the smallest negative subnormal rounds to -0"},
      {0x00010000, 0x0001, "the smallest bf16 subnormal, exact"},
      {0x00008000, 0x0000, "half the smallest subnormal: tie, to the even 0"},
      {0x00008001, 0x0001, "just above it rounds up"},
      {0x00018000, 0x0002, "subnormal tie to even"},
      {0x007f8000, 0x0080, "the largest subnormal's tie rounds up to the smallest normal"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(bf16(f32_from_bits(c.in)).bits, c.out) << c.what << std::hex << " (in 0x" << c.in << ")";
    EXPECT_EQ(ref_bf16_bits(double(f32_from_bits(c.in))), c.out) << "reference: " << c.what;
  }
  for (uint32_t nan : {0x7f800001u, 0x7fffffffu, 0xff800001u, 0x7fc00000u, 0xffffffffu}) {
    const uint16_t b = bf16(f32_from_bits(nan)).bits;
    EXPECT_TRUE(bf16_is_nan(b)) << std::hex << "NaN 0x" << nan << " became 0x" << b;
    EXPECT_EQ(b & 0x8000u, (nan >> 16) & 0x8000u) << "NaN sign";
  }
  EXPECT_EQ(float(bf16_from_bits(0x0001)), 0x1p-133f) << "bf16 subnormals widen exactly (no flush to zero)";
  EXPECT_TRUE(std::signbit(float(bf16_from_bits(0x8000))));
}

// Every bf16 widens to a float that rounds back to itself; floats across the whole range
// (every 251st bit pattern, so every exponent and many mantissas) round as the reference.
TEST(Bf16Rounding, RoundTripAndSweep) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t back = bf16(float(bf16_from_bits(uint16_t(b)))).bits;
    if (bf16_is_nan(uint16_t(b)))
      ASSERT_TRUE(bf16_is_nan(back)) << std::hex << b;
    else
      ASSERT_EQ(back, b) << std::hex << "bf16 0x" << b;
  }
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 251) {
    const float f = f32_from_bits(uint32_t(u));
    if (std::isnan(f)) continue;
    ASSERT_EQ(bf16(f).bits, ref_bf16_bits(double(f))) << std::hex << "float 0x" << u;
  }
}

// convert<> on device arrays: to bf16 from fp32 and fp64, each rounded once to nearest even,
// and back exactly.
template <class From>
void check_convert_to_bf16(const std::vector<From>& in) {
  Kokkos::View<From*, kernels::Mem> src("src", in.size());
  Kokkos::View<bf16*, kernels::Mem> dst("dst", in.size());
  Kokkos::View<From*, kernels::Mem> back("back", in.size());
  auto hs = Kokkos::create_mirror_view(src);
  for (size_t i = 0; i < in.size(); ++i) hs(i) = in[i];
  Kokkos::deep_copy(src, hs);
  kernels::convert<bf16, From>(dst.data(), src.data(), int64_t(in.size()));
  kernels::convert<From, bf16>(back.data(), dst.data(), int64_t(in.size()));
  auto hd = Kokkos::create_mirror_view(dst);
  auto hb = Kokkos::create_mirror_view(back);
  Kokkos::deep_copy(hd, dst);
  Kokkos::deep_copy(hb, back);
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t want = ref_bf16_bits(double(in[i]));
    if (bf16_is_nan(want)) {
      EXPECT_TRUE(bf16_is_nan(hd(i).bits)) << i;
      EXPECT_TRUE(std::isnan(hb(i))) << i;
      continue;
    }
    EXPECT_EQ(hd(i).bits, want) << kernels::dtype_name<From>() << " " << std::hexfloat << double(in[i]);
    EXPECT_EQ(f32_bits(float(hb(i))), uint32_t(want) << 16) << "widening back is exact, at " << i;
  }
}

// The first is past a tie by less than a float ulp, so it must round up; then ties, the
// overflow boundary, underflow, subnormal ties, zeros, inf and NaN.
std::vector<double> convert_cases() {
  std::vector<double> v = {1 + 0x1p-8 + 0x1p-30,
                           -(1 + 0x1p-8 + 0x1p-30),
                           1 + 0x1p-8,
                           1 + 0x1p-8 - 0x1p-40,
                           0x1.fefp127,
                           0x1.ff8p127,
                           1e300,
                           -1e300,
                           1e-300,
                           -1e-300,
                           0x1.8p-134,
                           0x1.0000000001p-134,
                           -0.0,
                           0.0,
                           std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN()};
  const Vec r = ref::random_vec(4096, 21, 1e3);
  v.insert(v.end(), r.begin(), r.end());
  return v;
}

TEST(Bf16Convert, FromDoubleRoundsOnce) { check_convert_to_bf16<double>(convert_cases()); }

TEST(Bf16Convert, FromFloat) {
  std::vector<float> f;
  for (double d : convert_cases()) f.push_back(float(d));
  for (uint32_t u : {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x00008000u, 0x007f8000u, 0x7f800001u})
    f.push_back(f32_from_bits(u));
  check_convert_to_bf16<float>(f);
}

// A View of n values of hash_uniform * amp rounded to bf16, and those values in fp64.
struct Bf16Data {
  kernels::View2<bf16> view;
  Vec vals;
};
Bf16Data bf16_data(const char* label, size_t n0, size_t n1, uint64_t seed, double amp = 1.0) {
  Bf16Data d{kernels::View2<bf16>(std::string(label), n0, n1), ref::random_vec(n0 * n1, seed, amp)};
  auto h = Kokkos::create_mirror_view(d.view);
  for (size_t i = 0; i < d.vals.size(); ++i) {
    h.data()[i] = bf16(float(d.vals[i]));
    d.vals[i] = double(float(h.data()[i]));
  }
  Kokkos::deep_copy(d.view, h);
  return d;
}

Vec abs_vec(Vec v) {
  for (double& x : v) x = std::fabs(x);
  return v;
}

// gemm<bf16> (bf16 C) or gemm_acc<bf16> (fp32 C) against alpha op(A) op(B) + beta C0 in fp64
// of the same bf16 values. Bound per element: the products of bf16 are exact in fp32, the sum
// of K of them and the alpha, beta terms take at most K + 3 roundings (u each) of magnitudes
// at most alpha sum|a||b| + |beta c0|; a bf16 C adds half an ulp of the value.
void check_bf16_gemm(int M, int N, int K, bool ta, bool tb, float alpha, float beta, bool acc_out) {
  const Bf16Data a = bf16_data("A", ta ? K : M, ta ? M : K, 31), b = bf16_data("B", tb ? N : K, tb ? K : N, 32);
  // beta = 0: C is not read, so a NaN there must not show.
  const double fill = beta == 0.0f ? std::numeric_limits<double>::quiet_NaN() : 2.0;
  const Bf16Data c0 = bf16_data("C", M, N, 33, fill);
  const auto T = [](bool t) { return t ? kernels::Trans::T : kernels::Trans::N; };
  Vec got;
  if (acc_out) {
    kernels::View2<float> C32("C32", M, N);
    kernels::convert_view<float, bf16>(C32, c0.view);
    kernels::gemm_acc<bf16>(T(ta), T(tb), alpha, a.view, b.view, beta, C32);
    got = test::to_vec(C32);
  } else {
    kernels::gemm<bf16>(T(ta), T(tb), alpha, a.view, b.view, beta, c0.view);
    got = test::to_vec(c0.view);
  }
  const Vec prod = ref::gemm(ta, tb, M, N, K, a.vals, b.vals);
  const Vec mag = ref::gemm(ta, tb, M, N, K, abs_vec(a.vals), abs_vec(b.vals));
  for (size_t i = 0; i < prod.size(); ++i) {
    const double c = beta == 0.0f ? 0.0 : double(beta) * c0.vals[i];
    const double want = double(alpha) * prod[i] + c;
    const double fp32 = (K + 3) * kU32 * (std::fabs(alpha) * mag[i] + std::fabs(c));
    const double tol = fp32 + (acc_out ? 0.0 : bf16_half_ulp(std::fabs(want) + fp32));
    ASSERT_LE(std::fabs(got[i] - want), tol)
        << (acc_out ? "gemm_acc" : "gemm") << " M=" << M << " N=" << N << " K=" << K << " ta=" << ta << " tb=" << tb
        << " alpha=" << alpha << " beta=" << beta << " at " << i << " (" << kernels::gemm_bf16_engine(M, N, K) << ")";
  }
}

TEST(Bf16Gemm, AllTransposesBetaAlpha) {
  for (bool acc_out : {false, true})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (float beta : {0.0f, 1.0f}) {
          check_bf16_gemm(37, 53, 29, ta, tb, 1.0f, beta, acc_out);
          check_bf16_gemm(37, 53, 29, ta, tb, -0.375f, beta, acc_out);
        }
}

TEST(Bf16Gemm, LargerAndDegenerate) {
  for (bool ta : {false, true}) {
    check_bf16_gemm(192, 320, 1024, ta, !ta, 0.125f, 1.0f, true);
    check_bf16_gemm(192, 320, 1024, ta, ta, 1.0f, 0.0f, false);
  }
  check_bf16_gemm(1, 1, 1, false, false, 2.0f, 1.0f, false);
  check_bf16_gemm(1, 17, 300, true, false, 1.0f, 0.0f, true);
  check_bf16_gemm(5, 3, 0, false, true, 1.0f, 1.0f, true);  // K = 0: C = beta C
}

TEST(Bf16Gemm, RejectsMismatchAndNamesEngine) {
  kernels::View2<bf16> A("A", 4, 5), B("B", 6, 3), C("C", 4, 3);
  kernels::View2<float> C32("C32", 4, 3);
  EXPECT_THROW(kernels::gemm<bf16>(kernels::Trans::N, kernels::Trans::N, 1, A, B, 0, C), std::invalid_argument);
  EXPECT_THROW(kernels::gemm_acc<bf16>(kernels::Trans::N, kernels::Trans::N, 1, A, B, 0, C32), std::invalid_argument);
  const std::string engine = kernels::gemm_bf16_engine(), od = kernels::onednn_version();
  if (od.empty()) {
    EXPECT_EQ(engine, "convert+sgemm");
    return;
  }
  EXPECT_EQ(od.rfind("2.", 0), 0u) << od;
  const char* isa = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (isa && std::string(isa) == "AVX2")  // oneDNN 2.x has no bf16 matmul below AVX-512
    EXPECT_EQ(engine.rfind("convert+sgemm (onednn " + od + ": ", 0), 0u) << engine;
  else
    EXPECT_TRUE(engine.rfind("onednn " + od + " ", 0) == 0 || engine.rfind("convert+sgemm (onednn " + od, 0) == 0)
        << engine;
}

// Each element of got within halfulp(want) + rel * |want| + abs of want: the fp32 (or fp64)
// arithmetic's bound plus the one rounding to bf16.
void expect_bf16_close(const Vec& got, const Vec& want, double rel, double abs, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double compute = rel * std::fabs(want[i]) + abs;
    ASSERT_LE(std::fabs(got[i] - want[i]), compute + bf16_half_ulp(std::fabs(want[i]) + compute))
        << what << " at " << i << ": got " << got[i] << ", want " << want[i];
  }
}

// rmsnorm in fp32: sum of N squares (N roundings), mean + eps, sqrt, divide (3), then x r w (2):
// at most (N + 6) u relative on y and (N/2 + 4) u on rstd (sqrt halves the sum's error).
TEST(Bf16LayerKernels, RmsNorm) {
  const int S = 19, N = 72;
  const double eps = 1e-5;
  const Bf16Data x = bf16_data("x", S, N, 4, 3.0), w2 = bf16_data("w", 1, N, 5);
  auto w = Kokkos::subview(w2.view, 0, Kokkos::ALL);
  kernels::View2<bf16> Y("y", S, N);
  kernels::View1<float> R("rstd", S);
  kernels::rmsnorm_fwd<bf16>(x.view, w, float(eps), Y, R);
  expect_bf16_close(test::to_vec(Y), ref::rmsnorm(x.vals, w2.vals, S, N, eps), (N + 6) * kU32, 0, "rmsnorm y");
  const Vec rstd = test::to_vec(R);
  for (int s = 0; s < S; ++s) {
    double ss = 0;
    for (int n = 0; n < N; ++n) ss += x.vals[size_t(s) * N + n] * x.vals[size_t(s) * N + n];
    const double want = 1.0 / std::sqrt(ss / N + double(float(eps)));
    EXPECT_LE(std::fabs(rstd[s] - want), (N / 2 + 4) * kU32 * want) << "rstd stays fp32, row " << s;
  }
}

// RoPE computes in fp64: the angle pos * freq is off by a few ulps of itself (pow and the
// product), cos and sin then by that much absolute: about 4 * 2^-52 * pos * (|x1| + |x2|).
TEST(Bf16LayerKernels, Rope) {
  const int S = 9, H = 3, D = 64;
  const std::vector<int64_t> pos = {0, 1, 7, 100, 4095, 65536, 1000003, 5, 2};
  const Bf16Data x = bf16_data("x", S * H, D, 6);
  kernels::View3<bf16> X("x3", S, H, D);
  Kokkos::deep_copy(X, kernels::View3<bf16>(x.view.data(), S, H, D));
  kernels::rope_apply<bf16>(X, test::make_index_view("pos", pos), 10000.0);
  expect_bf16_close(test::to_vec(X), ref::rope(x.vals, pos, S, H, D, 10000.0), 0, 8 * 0x1p-52 * 1000003 * 2.0, "rope");
}

// SwiGLU in fp32: exp_fast within 4e-7 (FastExp.MatchesStdExp) and a sigmoid's 1/(1+e) damps
// it; 1 + e, the divide and two products add 4 roundings.
TEST(Bf16LayerKernels, SwiGlu) {
  const int S = 13, F = 40;
  const Bf16Data a = bf16_data("a", S, F, 7, 6.0), b = bf16_data("b", S, F, 8);
  kernels::View2<bf16> Y("y", S, F);
  kernels::swiglu_fwd<bf16>(a.view, b.view, Y);
  expect_bf16_close(test::to_vec(Y), ref::swiglu(a.vals, b.vals), 4e-7 + 4 * kU32, 0, "swiglu");
}

// The bf16 ceiling: gemm<bf16> rates at 2048^3 and at a layer shape, the bf16 attention
// tiles where they run (attention_isa() avx512_bf16 or amx; none on the plain path), best() the largest.
TEST(Bf16Ceiling, ComponentsAndBest) {
  const kernels::Bf16GemmCeiling c = kernels::measure_bf16_gemm_ceiling({256, 512, 128}, [] {});
  EXPECT_GT(c.square, 1e8) << "gemm<bf16> 2048^3 in FLOP/s";
  EXPECT_GT(c.layer, 1e8) << "gemm<bf16> at the layer shape";
  if (kernels::attention_isa() == "avx512_bf16")
    EXPECT_GT(c.tile, 1e8) << "the bf16 tile kernel in FLOP/s";
  else
    EXPECT_EQ(c.tile, 0.0) << "the plain path has no bf16 tile kernel";
  EXPECT_EQ(c.best(), std::max({c.square, c.layer, c.tile}));
  {
    const test::EnvOverride plain("MINICP_ATTENTION_ISA", "plain");
    EXPECT_EQ(kernels::bf16_tile_gemm_rate([] {}), 0.0) << "MINICP_ATTENTION_ISA=plain: no bf16 tile kernel";
  }
  {
    const test::EnvOverride emulated("MINICP_ATTENTION_ISA", "amx-emulated");
    EXPECT_EQ(kernels::bf16_tile_gemm_rate([] {}), 0.0) << "amx-emulated: a check, not a rate";
  }
  if (kernels::detail::amx_unusable().empty()) {
    const test::EnvOverride amx("MINICP_ATTENTION_ISA", "amx");
    EXPECT_GT(kernels::bf16_tile_gemm_rate([] {}), 1e8) << "the AMX tiles in FLOP/s";
  }
  EXPECT_EQ(kernels::measure_bf16_gemm_ceiling({0, 0, 0}, [] {}).layer, 0.0) << "no layer shape: no layer rate";
}
}  // namespace

// The AMX engine's operand packing (attention_amx.hpp) against its definition, element by
// element, compiled with the kernels' ISA (so the AVX-512 transpose of whole 16 x 16 blocks
// is what runs where the CPU has it): S^T rounded to bf16 as bf16::round rounds it (NaNs,
// infinities, denormals, ties, -0), the pair rows of B, and zeros in all the padding, on
// shapes with whole and ragged blocks and an odd K.
#define MINICP_AMX_NS packing_test
#include "kernels/attention_amx.hpp"
namespace {
namespace pk = kernels::detail::tiled::packing_test;
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
TEST(AmxPacking, OperandsAreTheirDefinitions) {
  const int rows = 40, cols = 35, lds = 48;  // two whole 16-row blocks, one ragged; 2 + ragged columns
  std::vector<float> S(size_t(rows) * lds);
  uint32_t x = 99;
  const uint32_t special[] = {0x7fc00000u, 0x7f800001u, 0xff812345u, 0x7f800000u, 0xff800000u, 0x00000001u,
                              0x80400000u, 0x3f808000u, 0x3f818000u, 0x80000000u, 0x7f7fffffu, 0x3f80ffffu};
  for (size_t i = 0; i < S.size(); ++i) {
    x = x * 1664525u + 1013904223u;
    S[i] = i % 7 == 3 ? from_bits(special[(i / 7) % 12]) : from_bits(x);
  }
  pk::OperandA a;
  pk::a_rounded_transposed(a, S.data(), lds, rows, cols);  // A [cols, rows]
  ASSERT_EQ(a.ld, 64);
  for (int c = 0; c < 48; ++c)
    for (int r = 0; r < a.ld; ++r) {
      const uint16_t want = c < cols && r < rows ? kernels::bf16::round(S[r * lds + c]) : 0;
      ASSERT_EQ(a.v[size_t(c) * a.ld + r].bits, want) << "A[" << c << "][" << r << "]";
    }
  std::vector<kernels::bf16> X(size_t(rows) * lds);
  for (size_t i = 0; i < X.size(); ++i) X[i].bits = uint16_t(S[i] == S[i] ? kernels::bf16::round(S[i]) : 0x7fc0);
  for (int K : {rows, rows - 1}) {  // B [K, cols] from X's rows, and B = X^T for X [cols, K]
    pk::OperandB b, bt;
    pk::b_rows(b, X.data(), lds, K, cols);
    pk::b_transposed(bt, X.data(), lds, cols, K);
    ASSERT_EQ(b.pairs, 32);
    auto at = [&](int k, int n) -> uint32_t { return k < K && n < cols ? X[size_t(k) * lds + n].bits : 0; };
    auto at_t = [&](int k, int n) -> uint32_t { return k < K && n < cols ? X[size_t(n) * lds + k].bits : 0; };
    for (int p = 0; p < b.pairs; ++p)
      for (int n = 0; n < b.ld; ++n) {
        ASSERT_EQ(b.w[size_t(p) * b.ld + n], at(2 * p, n) | at(2 * p + 1, n) << 16)
            << "K " << K << " B[" << p << "][" << n << "]";
        ASSERT_EQ(bt.w[size_t(p) * bt.ld + n], at_t(2 * p, n) | at_t(2 * p + 1, n) << 16)
            << "K " << K << " B^T[" << p << "][" << n << "]";
      }
  }
}
}  // namespace
