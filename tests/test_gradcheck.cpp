// Finite-difference checks of every backward kernel in fp64: for a loss L = sum(W * y),
// the analytic gradient from the backward must match (L(x+h) - L(x-h)) / 2h entry by entry.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "kernels/attention.hpp"
#include "kernels/rmsnorm.hpp"
#include "kernels/rope.hpp"
#include "kernels/swiglu.hpp"
#include "tests/reference.hpp"
#include "tests/view_util.hpp"

namespace {
using namespace minicp;
using ref::Vec;
using V1 = kernels::View1<double>;
using V2 = kernels::View2<double>;
using V3 = kernels::View3<double>;

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Checks grad against central differences of loss(x) over every entry of x.
void fd_check(const char* what, Vec x, const Vec& grad, const std::function<double(const Vec&)>& loss) {
  const double h = 1e-6;
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss(x);
    x[i] = x0 - h;
    const double lm = loss(x);
    x[i] = x0;
    const double fd = (lp - lm) / (2 * h);
    const double err = std::abs(fd - grad[i]) / std::max(1.0, std::abs(fd));
    worst = std::max(worst, err);
    ASSERT_LE(err, 1e-6) << what << " entry " << i << ": analytic " << grad[i] << " vs finite difference " << fd;
  }
  ::testing::Test::RecordProperty(std::string(what) + "_worst_rel_err", std::to_string(worst));
}

struct AttnCase {
  const char* name;
  int Sq, Sk, H, Hkv, D;
  bool causal;
  int64_t window;
  bool docs;
  kernels::AttnImpl impl;
};

class AttentionGrad : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionGrad, MatchesFiniteDifferences) {
  const AttnCase c = GetParam();
  const Vec q = ref::random_vec(size_t(c.Sq) * c.H * c.D, 21, 2.0),
            k = ref::random_vec(size_t(c.Sk) * c.Hkv * c.D, 22, 2.0),
            v = ref::random_vec(size_t(c.Sk) * c.Hkv * c.D, 23), w = ref::random_vec(size_t(c.Sq) * c.H * c.D, 24);
  std::vector<int64_t> qpos, kpos;
  std::vector<int32_t> qdoc, kdoc;
  for (int i = 0; i < c.Sq; ++i) qpos.push_back(c.Sk - c.Sq + i);
  for (int j = 0; j < c.Sk; ++j) kpos.push_back(j);
  if (c.docs) {
    for (auto p : qpos) qdoc.push_back(int32_t(p / 5));
    for (auto p : kpos) kdoc.push_back(int32_t(p / 5));
  }
  kernels::AttnMask m;
  m.q_pos = test::make_index_view("qpos", qpos);
  m.k_pos = test::make_index_view("kpos", kpos);
  if (c.docs) {
    m.q_doc = test::make_index_view("qdoc", qdoc);
    m.k_doc = test::make_index_view("kdoc", kdoc);
  }
  m.causal = c.causal;
  m.window = c.window;
  kernels::AttnOptions opt;
  opt.impl = c.impl;
  opt.tile_q = opt.tile_k = 4;  // several tiles, ragged last tile

  auto forward = [&](const Vec& qq, const Vec& kk, const Vec& vv, V3& o, V2& lse) {
    auto Q = test::make_view<V3>("q", qq, c.Sq, c.H, c.D);
    auto K = test::make_view<V3>("k", kk, c.Sk, c.Hkv, c.D);
    auto Vv = test::make_view<V3>("v", vv, c.Sk, c.Hkv, c.D);
    o = V3("o", c.Sq, c.H, c.D);
    lse = V2("lse", c.Sq, c.H);
    kernels::attention_fwd<double>(Q, K, Vv, m, o, lse, opt);
  };
  auto loss = [&](const Vec& qq, const Vec& kk, const Vec& vv) {
    V3 o;
    V2 lse;
    forward(qq, kk, vv, o, lse);
    return dot(test::to_vec(o), w);
  };
  V3 o;
  V2 lse;
  forward(q, k, v, o, lse);
  auto Q = test::make_view<V3>("q", q, c.Sq, c.H, c.D);
  auto K = test::make_view<V3>("k", k, c.Sk, c.Hkv, c.D);
  auto Vv = test::make_view<V3>("v", v, c.Sk, c.Hkv, c.D);
  auto dO = test::make_view<V3>("dout", w, c.Sq, c.H, c.D);
  V3 dq("dq", c.Sq, c.H, c.D), dk("dk", c.Sk, c.Hkv, c.D), dv("dv", c.Sk, c.Hkv, c.D);
  kernels::attention_bwd<double>(Q, K, Vv, o, lse, dO, m, dq, dk, dv, opt);
  fd_check("dQ", q, test::to_vec(dq), [&](const Vec& x) { return loss(x, k, v); });
  fd_check("dK", k, test::to_vec(dk), [&](const Vec& x) { return loss(q, x, v); });
  fd_check("dV", v, test::to_vec(dv), [&](const Vec& x) { return loss(q, k, x); });
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, AttentionGrad,
    ::testing::Values(AttnCase{"causal_gqa_tiled", 11, 11, 4, 2, 8, true, 0, false, kernels::AttnImpl::Tiled},
                      AttnCase{"full_tiled", 9, 13, 2, 1, 8, false, 0, false, kernels::AttnImpl::Tiled},
                      AttnCase{"window_docs_tiled", 12, 12, 2, 2, 8, true, 3, true, kernels::AttnImpl::Tiled},
                      AttnCase{"causal_gqa_portable", 11, 11, 4, 2, 8, true, 0, false, kernels::AttnImpl::Portable},
                      AttnCase{"window_docs_portable", 12, 12, 2, 2, 8, true, 3, true, kernels::AttnImpl::Portable},
                      AttnCase{"causal_gqa_team", 11, 11, 4, 2, 8, true, 0, false, kernels::AttnImpl::Team},
                      AttnCase{"window_docs_team", 12, 12, 2, 2, 8, true, 3, true, kernels::AttnImpl::Team}),
    [](const ::testing::TestParamInfo<AttnCase>& i) { return std::string(i.param.name); });

TEST(RmsNormGrad, MatchesFiniteDifferences) {
  const int S = 5, N = 12;
  const Vec x = ref::random_vec(size_t(S) * N, 31, 2.0), w = ref::random_vec(N, 32),
            g = ref::random_vec(size_t(S) * N, 33);
  auto loss = [&](const Vec& xx, const Vec& ww) { return dot(ref::rmsnorm(xx, ww, S, N, 1e-5), g); };
  auto X = test::make_view<V2>("x", x, S, N);
  auto W = test::make_view<V1>("w", w, N);
  auto G = test::make_view<V2>("g", g, S, N);
  V2 Y("y", S, N), dX("dx", S, N);
  V1 R("rstd", S);
  auto dW = test::make_view<V1>("dw", Vec(N, 0.25), N);  // accumulates onto what is there
  kernels::rmsnorm_fwd<double>(X, W, 1e-5, Y, R);
  kernels::rmsnorm_bwd<double>(X, W, R, G, dX, dW);
  fd_check("dx", x, test::to_vec(dX), [&](const Vec& xx) { return loss(xx, w); });
  Vec dw = test::to_vec(dW);
  for (auto& e : dw) e -= 0.25;
  fd_check("dw", w, dw, [&](const Vec& ww) { return loss(x, ww); });
}

TEST(RopeGrad, MatchesFiniteDifferences) {
  const int S = 4, H = 2, D = 8;
  const std::vector<int64_t> pos = {3, 0, 1000, 17};
  const Vec x = ref::random_vec(size_t(S) * H * D, 41), g = ref::random_vec(size_t(S) * H * D, 42);
  auto G = test::make_view<V3>("g", g, S, H, D);
  kernels::rope_apply<double>(G, test::make_index_view("pos", pos), 10000.0, /*inverse=*/true);
  fd_check("dx", x, test::to_vec(G), [&](const Vec& xx) { return dot(ref::rope(xx, pos, S, H, D, 10000.0), g); });
}

TEST(SwiGluGrad, MatchesFiniteDifferences) {
  const int S = 3, F = 10;
  const Vec a = ref::random_vec(size_t(S) * F, 51, 5.0), b = ref::random_vec(size_t(S) * F, 52),
            g = ref::random_vec(size_t(S) * F, 53);
  auto A = test::make_view<V2>("a", a, S, F);
  auto B = test::make_view<V2>("b", b, S, F);
  auto G = test::make_view<V2>("g", g, S, F);
  V2 dA("da", S, F), dB("db", S, F);
  kernels::swiglu_bwd<double>(A, B, G, dA, dB);
  fd_check("da", a, test::to_vec(dA), [&](const Vec& aa) { return dot(ref::swiglu(aa, b), g); });
  fd_check("db", b, test::to_vec(dB), [&](const Vec& bb) { return dot(ref::swiglu(a, bb), g); });
}

}  // namespace
