// GEMM, RMSNorm, RoPE and SwiGLU forward kernels against the fp64 references, fp32 and fp64.
#include <gtest/gtest.h>

#include "kernels/fast_exp.hpp"
#include "kernels/gemm.hpp"
#include "kernels/rmsnorm.hpp"
#include "kernels/rope.hpp"
#include "kernels/swiglu.hpp"
#include "kernels/tile_gemm.hpp"
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
      kernels::gemm<T>(ta ? kernels::Trans::T : kernels::Trans::N, tb ? kernels::Trans::T : kernels::Trans::N, 0.5,
                       A, B, 2.0, C);
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
