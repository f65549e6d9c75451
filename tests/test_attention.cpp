// Attention forward/backward and the LSE merge against the fp64 materialised reference,
// for both implementations (tiled BLAS path, portable path), fp32 and fp64, over masks
// (causal, full, window, documents), GQA, and edge cases (S=1, ragged tiles, empty rows);
// bf16 on its two paths (avx512_bf16, plain) against fp64 of the same bf16 inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>

#include "kernels/amx_tiles.hpp"
#include "kernels/attention.hpp"
#include "kernels/attention_impl.hpp"
#include "kernels/fault_guard.hpp"
#include "tests/env_override.hpp"
#include "tests/reference.hpp"
#include "tests/view_util.hpp"

namespace {
using namespace minicp;
using kernels::AttnImpl;
using ref::Vec;

struct Case {
  std::string name;
  int Sq, Sk, H, Hkv, D;
  bool causal;
  int64_t window;
  bool docs;
  int64_t q_offset;  // q_pos = q_offset + i, k_pos = j (q_offset < 0 leaves early rows empty)
  int tile;          // tiled path tile size (q and k)
};

std::vector<Case> cases() {
  return {
      {"causal_d64", 150, 150, 4, 4, 64, true, 0, false, 0, 32},
      {"full_d64", 96, 130, 2, 2, 64, false, 0, false, 0, 32},
      {"causal_d128_gqa", 200, 200, 8, 2, 128, true, 0, false, 0, 64},
      {"kv_heads_1", 77, 77, 4, 1, 64, true, 0, false, 0, 16},
      {"window_lt_tile", 120, 120, 2, 2, 64, true, 5, false, 0, 32},
      {"window_noncausal_flag", 90, 90, 2, 1, 64, false, 17, false, 0, 16},
      {"docs_packed", 140, 140, 2, 2, 64, true, 0, true, 0, 32},
      {"docs_full", 100, 100, 2, 2, 64, false, 0, true, 0, 32},
      {"s1", 1, 1, 2, 1, 64, true, 0, false, 0, 128},
      {"s1_decode", 1, 257, 4, 2, 128, true, 0, false, 256, 64},
      {"empty_rows", 64, 80, 2, 2, 64, true, 0, false, -30, 16},
      {"default_tiles_ragged", 300, 300, 2, 2, 128, true, 0, false, 0, 0},
      // head dims that are not whole 64-column panels: tile::gemm's one-vector panels and
      // scalar columns (24 = 16 + 8, 40 = 16 + 16 + 8 in fp32)
      {"d24_tails", 70, 90, 4, 2, 24, true, 0, false, 0, 0},
      {"d40_tails_full", 100, 60, 2, 1, 40, false, 0, false, 0, 32},
  };
}

struct Inputs {
  Vec q, k, v, dout;
  ref::Mask mask;
  double scale;
};

Inputs make_inputs(const Case& c) {
  Inputs in;
  in.q = ref::random_vec(size_t(c.Sq) * c.H * c.D, 11, 2.0);
  in.k = ref::random_vec(size_t(c.Sk) * c.Hkv * c.D, 12, 2.0);
  in.v = ref::random_vec(size_t(c.Sk) * c.Hkv * c.D, 13);
  in.dout = ref::random_vec(size_t(c.Sq) * c.H * c.D, 14);
  for (int i = 0; i < c.Sq; ++i) in.mask.qpos.push_back(c.q_offset + i);
  for (int j = 0; j < c.Sk; ++j) in.mask.kpos.push_back(j);
  if (c.docs) {  // documents of lengths 37, 37, ... by position
    for (auto p : in.mask.qpos) in.mask.qdoc.push_back(int32_t((p < 0 ? 0 : p) / 37));
    for (auto p : in.mask.kpos) in.mask.kdoc.push_back(int32_t(p / 37));
  }
  in.mask.causal = c.causal;
  in.mask.window = c.window;
  in.scale = 1.0 / std::sqrt(double(c.D));
  return in;
}

kernels::AttnMask device_mask(const ref::Mask& m) {
  kernels::AttnMask dm;
  dm.q_pos = test::make_index_view("q_pos", m.qpos);
  dm.k_pos = test::make_index_view("k_pos", m.kpos);
  if (!m.qdoc.empty()) {
    dm.q_doc = test::make_index_view("q_doc", m.qdoc);
    dm.k_doc = test::make_index_view("k_doc", m.kdoc);
  }
  dm.causal = m.causal;
  dm.window = m.window;
  return dm;
}

// Reference backward by the textbook formulas on the materialised probabilities.
struct Grads {
  Vec dq, dk, dv;
};
// o_stored: the output the row term Delta = dO . o is taken from (default: the exact one).
Grads ref_backward(const Case& c, const Inputs& in, const Vec* o_stored = nullptr) {
  Grads g{Vec(in.q.size(), 0.0), Vec(in.k.size(), 0.0), Vec(in.v.size(), 0.0)};
  const auto fwd = ref::attention_fwd(in.q, in.k, in.v, c.Sq, c.Sk, c.H, c.Hkv, c.D, in.mask, in.scale);
  const Vec& o_delta = o_stored ? *o_stored : fwd.o;
  const int group = c.H / c.Hkv;
  for (int i = 0; i < c.Sq; ++i)
    for (int h = 0; h < c.H; ++h) {
      const double L = fwd.lse[size_t(i) * c.H + h];
      if (std::isinf(L)) continue;
      const int gk = h / group;
      auto Q = [&](int d) { return in.q[(size_t(i) * c.H + h) * c.D + d]; };
      auto dO = [&](int d) { return in.dout[(size_t(i) * c.H + h) * c.D + d]; };
      double delta = 0;
      for (int d = 0; d < c.D; ++d) delta += dO(d) * o_delta[(size_t(i) * c.H + h) * c.D + d];
      for (int j = 0; j < c.Sk; ++j) {
        if (!in.mask.visible(i, j)) continue;
        const size_t kb = (size_t(j) * c.Hkv + gk) * c.D;
        double s = 0, dp = 0;
        for (int d = 0; d < c.D; ++d) {
          s += Q(d) * in.k[kb + d];
          dp += dO(d) * in.v[kb + d];
        }
        const double p = std::exp(s * in.scale - L);
        const double ds = p * (dp - delta);
        for (int d = 0; d < c.D; ++d) {
          g.dq[(size_t(i) * c.H + h) * c.D + d] += in.scale * ds * in.k[kb + d];
          g.dk[kb + d] += in.scale * ds * Q(d);
          g.dv[kb + d] += p * dO(d);
        }
      }
    }
  return g;
}

template <class T>
double tolerance() {
  return std::is_same<T, float>::value ? 2e-5 : 1e-11;
}

template <class T>
void run_case(const Case& c, AttnImpl impl, int team_size = 0) {
  SCOPED_TRACE(c.name +
               (impl == AttnImpl::Tiled  ? " tiled "
                : impl == AttnImpl::Team ? " team "
                                         : " portable ") +
               (std::is_same<T, float>::value ? "fp32" : "fp64"));
  const Inputs in = make_inputs(c);
  const auto ref_fwd = ref::attention_fwd(in.q, in.k, in.v, c.Sq, c.Sk, c.H, c.Hkv, c.D, in.mask, in.scale);
  const Grads ref_g = ref_backward(c, in);

  auto q = test::make_view<kernels::View3<T>>("q", in.q, c.Sq, c.H, c.D);
  auto k = test::make_view<kernels::View3<T>>("k", in.k, c.Sk, c.Hkv, c.D);
  auto v = test::make_view<kernels::View3<T>>("v", in.v, c.Sk, c.Hkv, c.D);
  auto dout = test::make_view<kernels::View3<T>>("dout", in.dout, c.Sq, c.H, c.D);
  kernels::View3<T> o("o", c.Sq, c.H, c.D), dq("dq", c.Sq, c.H, c.D);
  kernels::View3<T> dk("dk", c.Sk, c.Hkv, c.D), dv("dv", c.Sk, c.Hkv, c.D);
  kernels::View2<T> lse("lse", c.Sq, c.H);
  const auto mask = device_mask(in.mask);
  kernels::AttnOptions opt;
  opt.impl = impl;
  opt.tile_q = opt.tile_k = c.tile;
  opt.team_size = team_size;

  const auto st = kernels::attention_fwd<T>(q, k, v, mask, o, lse, opt);
  Kokkos::fence();
  const Vec got_o = test::to_vec(o), got_lse = test::to_vec(lse);
  EXPECT_LE(ref::rel_err(got_o, ref_fwd.o), tolerance<T>()) << "forward O";
  size_t empty_rows = 0;
  for (size_t r = 0; r < got_lse.size(); ++r) {
    ASSERT_FALSE(std::isnan(got_lse[r])) << "row " << r;
    if (std::isinf(ref_fwd.lse[r])) {
      ++empty_rows;
      EXPECT_TRUE(std::isinf(got_lse[r]) && got_lse[r] < 0) << "row " << r << " must have LSE -inf";
      for (int d = 0; d < c.D; ++d) EXPECT_EQ(got_o[r * c.D + d], 0.0);
    } else {
      EXPECT_NEAR(got_lse[r], ref_fwd.lse[r], 10 * tolerance<T>() * std::max(1.0, std::abs(ref_fwd.lse[r])))
          << "row " << r;
    }
  }
  if (c.name == "empty_rows") {
    EXPECT_GT(empty_rows, 0u) << "the case must exercise fully masked rows";
  }
  const double useful_pairs = [&] {
    double n = 0;
    for (int i = 0; i < c.Sq; ++i)
      for (int j = 0; j < c.Sk; ++j) n += in.mask.visible(i, j);
    return n;
  }();
  EXPECT_GE(st.flops + 1e-9, 4.0 * c.D * c.H * useful_pairs) << "executed FLOPs cover the useful ones";

  kernels::attention_bwd<T>(q, k, v, o, lse, dout, mask, dq, dk, dv, opt);
  Kokkos::fence();
  EXPECT_LE(ref::rel_err(test::to_vec(dq), ref_g.dq), 5 * tolerance<T>()) << "dQ";
  EXPECT_LE(ref::rel_err(test::to_vec(dk), ref_g.dk), 5 * tolerance<T>()) << "dK";
  EXPECT_LE(ref::rel_err(test::to_vec(dv), ref_g.dv), 5 * tolerance<T>()) << "dV";

  // Backward accumulates: a second call doubles the gradients.
  kernels::attention_bwd<T>(q, k, v, o, lse, dout, mask, dq, dk, dv, opt);
  Kokkos::fence();
  Vec twice = ref_g.dk;
  for (auto& x : twice) x *= 2;
  EXPECT_LE(ref::rel_err(test::to_vec(dk), twice), 5 * tolerance<T>()) << "dK after two accumulating calls";
}

class AttentionCase : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionCase, TiledFp32) { run_case<float>(GetParam(), AttnImpl::Tiled); }
TEST_P(AttentionCase, TiledFp64) { run_case<double>(GetParam(), AttnImpl::Tiled); }
TEST_P(AttentionCase, PortableFp32) { run_case<float>(GetParam(), AttnImpl::Portable); }
// The team kernel with teams of two threads where the pool has them (its barriers and the
// dQ atomics then race for real), and with Kokkos's own team size.
int two_if_possible() { return std::min(2, int(kernels::Exec().concurrency())); }
TEST_P(AttentionCase, TeamFp32) { run_case<float>(GetParam(), AttnImpl::Team, two_if_possible()); }
TEST_P(AttentionCase, TeamFp64) { run_case<double>(GetParam(), AttnImpl::Team); }
TEST_P(AttentionCase, PortableFp64) { run_case<double>(GetParam(), AttnImpl::Portable); }

INSTANTIATE_TEST_SUITE_P(Kernels, AttentionCase, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

TEST(Attention, CausalSkipsMaskedTiles) {
  Case c{"skip", 256, 256, 2, 2, 64, true, 0, false, 0, 32};
  const Inputs in = make_inputs(c);
  auto q = test::make_view<kernels::View3<float>>("q", in.q, c.Sq, c.H, c.D);
  auto k = test::make_view<kernels::View3<float>>("k", in.k, c.Sk, c.Hkv, c.D);
  kernels::View3<float> o("o", c.Sq, c.H, c.D);
  kernels::View2<float> lse("lse", c.Sq, c.H);
  kernels::AttnOptions opt;
  opt.impl = AttnImpl::Tiled;
  opt.tile_q = opt.tile_k = 32;
  const auto st = kernels::attention_fwd<float>(q, k, k, device_mask(in.mask), o, lse, opt);
  // 8x8 tiles per head: 36 on or below the diagonal, 28 above it.
  EXPECT_EQ(st.blocks_computed, 2 * 36);
  EXPECT_EQ(st.blocks_skipped, 2 * 28);
}

TEST(Attention, RejectsBadShapes) {
  kernels::View3<float> q("q", 8, 6, 16), k("k", 8, 4, 16), o("o", 8, 6, 16);
  kernels::View2<float> lse("lse", 8, 6);
  std::vector<int64_t> pos(8);
  for (int i = 0; i < 8; ++i) pos[i] = i;
  kernels::AttnMask m;
  m.q_pos = m.k_pos = test::make_index_view("pos", pos);
  try {
    kernels::attention_fwd<float>(q, k, k, m, o, lse);
    FAIL() << "heads 6 with kv_heads 4 must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("kv_heads (4)"), std::string::npos) << e.what();
  }
}

// Merge: attention over keys [0, a) and [a, Sk) merged by LSE equals attention over all.
template <class T>
void merge_case() {
  Case c{"merge", 70, 90, 2, 2, 64, true, 20, false, 0, 16};
  Inputs in = make_inputs(c);
  const auto full = ref::attention_fwd(in.q, in.k, in.v, c.Sq, c.Sk, c.H, c.Hkv, c.D, in.mask, in.scale);
  const int a = 50;
  auto part = [&](int j0, int j1, kernels::View3<T>& o, kernels::View2<T>& lse) {
    ref::Mask m = in.mask;
    m.kpos.assign(in.mask.kpos.begin() + j0, in.mask.kpos.begin() + j1);
    const size_t w = size_t(c.Hkv) * c.D;
    Vec kk(in.k.begin() + j0 * w, in.k.begin() + j1 * w), vv(in.v.begin() + j0 * w, in.v.begin() + j1 * w);
    auto q = test::make_view<kernels::View3<T>>("q", in.q, c.Sq, c.H, c.D);
    auto k = test::make_view<kernels::View3<T>>("k", kk, j1 - j0, c.Hkv, c.D);
    auto v = test::make_view<kernels::View3<T>>("v", vv, j1 - j0, c.Hkv, c.D);
    kernels::attention_fwd<T>(q, k, v, device_mask(m), o, lse);
  };
  kernels::View3<T> o1("o1", c.Sq, c.H, c.D), o2("o2", c.Sq, c.H, c.D);
  kernels::View2<T> l1("l1", c.Sq, c.H), l2("l2", c.Sq, c.H);
  part(0, a, o1, l1);
  part(a, c.Sk, o2, l2);
  // Rows with q_pos < a see no key of the second part: their LSE there is -inf.
  const Vec l2h = test::to_vec(l2);
  EXPECT_TRUE(std::isinf(l2h[0]) && l2h[0] < 0);
  kernels::lse_merge<T>(o1, l1, o2, l2);
  Kokkos::fence();
  EXPECT_LE(ref::rel_err(test::to_vec(o1), full.o), tolerance<T>());
  EXPECT_LE(ref::rel_err(test::to_vec(l1), full.lse), tolerance<T>());
}
TEST(LseMerge, SplitKeysFp32) { merge_case<float>(); }
TEST(LseMerge, SplitKeysFp64) { merge_case<double>(); }

TEST(LseMerge, BothEmptyGivesZeroNotNaN) {
  const double ninf = -std::numeric_limits<double>::infinity();
  auto o = test::make_view<kernels::View3<float>>("o", Vec(4, 7.0), 1, 1, 4);
  auto o2 = test::make_view<kernels::View3<float>>("o2", Vec(4, 3.0), 1, 1, 4);
  auto l = test::make_view<kernels::View2<float>>("l", Vec{ninf}, 1, 1);
  auto l2 = test::make_view<kernels::View2<float>>("l2", Vec{ninf}, 1, 1);
  kernels::lse_merge<float>(o, l, o2, l2);
  for (double x : test::to_vec(o)) EXPECT_EQ(x, 0.0);
  const double lv = test::to_vec(l)[0];
  EXPECT_TRUE(std::isinf(lv) && lv < 0);
  // One side empty: the other side passes through unchanged.
  auto o3 = test::make_view<kernels::View3<float>>("o3", Vec(4, 5.0), 1, 1, 4);
  auto l3 = test::make_view<kernels::View2<float>>("l3", Vec{1.5}, 1, 1);
  kernels::lse_merge<float>(o, l, o3, l3);
  for (double x : test::to_vec(o)) EXPECT_FLOAT_EQ(x, 5.0);
  EXPECT_FLOAT_EQ(test::to_vec(l)[0], 1.5);
}

// bf16: the avx512_bf16 path (bf16 tiles, P and dS rounded to bf16 before their products)
// and the plain path (inputs widened to fp32) on the same bf16 inputs, each against fp64 of
// those inputs. The fast path may lose what its extra roundings cost, no more: its error is
// held within twice the plain path's, or one bf16 ulp (2^-8) of the largest entry.
using kernels::bf16;
constexpr const char* kIsaVar = "MINICP_ATTENTION_ISA";
using test::EnvOverride;

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) && (defined(__clang__) || __GNUC__ >= 10)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

struct Bf16Out {
  Vec o, lse, dq, dk, dv;
  kernels::AttnStats fwd, bwd;
};

// Forward, then backward from the given stored o (bf16) and lse (fp32), on the path the
// environment selects (or impl's). dq, dk, dv start from nonzero values, so += is checked too.
Bf16Out run_bf16(const Case& c, const Inputs& in, const Vec& o_stored, const Vec& lse_stored,
                 AttnImpl impl = AttnImpl::Auto) {
  using V3 = kernels::View3<bf16>;
  using F3 = kernels::View3<float>;
  const auto q = test::make_view<V3>("q", in.q, c.Sq, c.H, c.D);
  const auto dout = test::make_view<V3>("do", in.dout, c.Sq, c.H, c.D);
  const auto k = test::make_view<V3>("k", in.k, c.Sk, c.Hkv, c.D);
  const auto v = test::make_view<V3>("v", in.v, c.Sk, c.Hkv, c.D);
  const auto o_in = test::make_view<V3>("o_in", o_stored, c.Sq, c.H, c.D);
  const auto lse_in = test::make_view<kernels::View2<float>>("lse_in", lse_stored, c.Sq, c.H);
  const Vec g0q = ref::random_vec(in.q.size(), 21), g0k = ref::random_vec(in.k.size(), 22);
  const auto dq = test::make_view<F3>("dq", g0q, c.Sq, c.H, c.D);
  const auto dk = test::make_view<F3>("dk", g0k, c.Sk, c.Hkv, c.D);
  const auto dv = test::make_view<F3>("dv", g0k, c.Sk, c.Hkv, c.D);
  F3 o("o", c.Sq, c.H, c.D);
  kernels::View2<float> lse("lse", c.Sq, c.H);
  kernels::AttnOptions opt;
  opt.tile_q = opt.tile_k = c.tile;
  opt.impl = impl;
  Bf16Out r;
  r.fwd = kernels::attention_fwd<bf16>(q, k, v, device_mask(in.mask), o, lse, opt);
  r.bwd = kernels::attention_bwd<bf16>(q, k, v, o_in, lse_in, dout, device_mask(in.mask), dq, dk, dv, opt);
  Kokkos::fence();
  auto minus = [](Vec a, const Vec& b) {
    for (size_t i = 0; i < a.size(); ++i) a[i] -= b[i];
    return a;
  };
  r.o = test::to_vec(o), r.lse = test::to_vec(lse);
  r.dq = minus(test::to_vec(dq), g0q), r.dk = minus(test::to_vec(dk), g0k), r.dv = minus(test::to_vec(dv), g0k);
  return r;
}

// max |got - want| over the finite entries of want; where want is -inf, got must be -inf too.
double max_err(const Vec& got, const Vec& want, const std::string& what) {
  double e = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_TRUE(std::isinf(got[i]) && got[i] < 0) << what << " entry " << i << " must be -inf";
      continue;
    }
    e = std::max(e, std::abs(got[i] - want[i]));
  }
  return e;
}

void expect_within_plain(const Vec& fast, const Vec& plain, const Vec& want, const std::string& what) {
  double largest = 0;
  for (double w : want)
    if (!std::isinf(w)) largest = std::max(largest, std::abs(w));
  const double e_fast = max_err(fast, want, what + " (avx512_bf16)"), e_plain = max_err(plain, want, what + " (plain)");
  const double bound = std::max(2 * e_plain, 0x1p-8 * largest);
  EXPECT_LE(e_fast, bound) << what << ": avx512_bf16 error " << e_fast << ", plain " << e_plain
                           << ", 2^-8 of the largest entry " << 0x1p-8 * largest;
}

class Bf16AttentionCase : public ::testing::TestWithParam<Case> {};

// bf16 inputs of a case, their fp64 forward and what a training step stores of it, and the
// fp64 gradients from that stored output.
struct Bf16Problem {
  Inputs in;
  ref::AttnOut want;
  Vec o_stored, lse_stored;
  Grads want_g;
};
Bf16Problem bf16_problem(const Case& c) {
  Bf16Problem p;
  p.in = make_inputs(c);
  for (Vec* x : {&p.in.q, &p.in.k, &p.in.v, &p.in.dout}) *x = test::bf16_rounded(*x);
  p.want = ref::attention_fwd(p.in.q, p.in.k, p.in.v, c.Sq, c.Sk, c.H, c.Hkv, c.D, p.in.mask, p.in.scale);
  p.o_stored = test::bf16_rounded(p.want.o);  // what a bf16 training step keeps of the output
  p.lse_stored = p.want.lse;
  for (double& x : p.lse_stored) x = double(float(x));
  p.want_g = ref_backward(c, p.in, &p.o_stored);
  return p;
}

// got within the plain path's bound on every tensor, empty rows 0, the same blocks and FLOPs.
void expect_bf16_matches_plain(const Case& c, const Bf16Problem& p, const Bf16Out& got, const Bf16Out& plain,
                               const std::string& path) {
  expect_within_plain(got.o, plain.o, p.want.o, path + " O");
  expect_within_plain(got.lse, plain.lse, p.want.lse, path + " LSE");
  expect_within_plain(got.dq, plain.dq, p.want_g.dq, path + " dQ");
  expect_within_plain(got.dk, plain.dk, p.want_g.dk, path + " dK");
  expect_within_plain(got.dv, plain.dv, p.want_g.dv, path + " dV");
  for (size_t r = 0; r < p.want.lse.size(); ++r) {
    if (!std::isinf(p.want.lse[r])) continue;
    for (int d = 0; d < c.D; ++d) EXPECT_EQ(got.o[r * c.D + d], 0.0) << path << " empty row " << r;
  }
}

Bf16Out run_plain(const Case& c, const Bf16Problem& p) {
  const EnvOverride force(kIsaVar, "plain");
  return run_bf16(c, p.in, p.o_stored, p.lse_stored);
}

// A bf16 tile path (got) within the plain path's bound, a distinct computation with the
// same blocks and FLOPs.
void expect_tiles_match_plain(const Case& c, const Bf16Problem& p, const Bf16Out& got, const std::string& path) {
  const Bf16Out plain = run_plain(c, p);
  EXPECT_NE(got.o, plain.o) << "the two paths must be distinct computations";
  expect_bf16_matches_plain(c, p, got, plain, path);
  EXPECT_EQ(got.fwd.flops, plain.fwd.flops);
  EXPECT_EQ(got.bwd.flops, plain.bwd.flops);
  EXPECT_EQ(got.fwd.blocks_computed, plain.fwd.blocks_computed);
  EXPECT_EQ(got.bwd.blocks_skipped, plain.bwd.blocks_skipped);
}

// The outputs of the path MINICP_ATTENTION_ISA=isa selects.
Bf16Out run_isa(const Case& c, const Bf16Problem& p, const char* isa) {
  const EnvOverride force(kIsaVar, isa);
  return run_bf16(c, p.in, p.o_stored, p.lse_stored);
}

TEST_P(Bf16AttentionCase, FastWithinPlainBound) {
  const EnvOverride unset(kIsaVar, nullptr);  // the fast path wherever the CPU has it
  if (kernels::attention_isa() != "avx512_bf16")
    GTEST_SKIP() << "this CPU has no AVX512-BF16 (attention_isa() is plain)";
  const Case& c = GetParam();
  const Bf16Problem p = bf16_problem(c);
  expect_tiles_match_plain(c, p, run_bf16(c, p.in, p.o_stored, p.lse_stored), "avx512_bf16");
}

// The team kernel reads bf16 and computes in fp32 (the device's bf16 path): held to the same
// bound as the AVX512-BF16 path, against the same plain path.
TEST_P(Bf16AttentionCase, TeamWithinPlainBound) {
  const Case& c = GetParam();
  const Bf16Problem p = bf16_problem(c);
  const Bf16Out team = run_bf16(c, p.in, p.o_stored, p.lse_stored, AttnImpl::Team);
  const Bf16Out plain = run_plain(c, p);
  expect_bf16_matches_plain(c, p, team, plain, "team");
}

// The emulated TDPBF16PS, on cases whose answer is known bit for bit: whole products of small
// integers (the layouts: A's rows, B's pair rows, C's columns), the even pair's product added
// before the odd one's, each addition rounded to nearest even, bf16 denormals read as zero
// and denormal results flushed.
namespace amxt {
using Tiles = kernels::amx::EmulatedTiles;
constexpr int R = kernels::amx::kTileRows, K = kernels::amx::kTileK, W = kernels::amx::kTileN;
struct Operands {
  uint16_t a[R][K] = {}, b[K / 2][2 * W] = {};  // A [16, 32]; B pair rows: b[p][2n + h] = B[2p + h][n]
  float c[R][W] = {};
};
uint16_t bits(float f) { return kernels::bf16(f).bits; }
// C (loaded from o.c) += A B, returned.
std::vector<float> product(const Operands& o) {
  Tiles::load<0>(o.c, sizeof o.c[0]);
  Tiles::load<1>(o.a, sizeof o.a[0]);
  Tiles::load<2>(o.b, sizeof o.b[0]);
  Tiles::dpbf16ps<0, 1, 2>();
  std::vector<float> c(size_t(R) * W);
  Tiles::store<0>(c.data(), W * sizeof(float));
  return c;
}
}  // namespace amxt

TEST(AmxTiles, EmulationIsTheInstructionsArithmetic) {
  using namespace amxt;
  Operands o;
  for (int m = 0; m < R; ++m)
    for (int k = 0; k < K; ++k) o.a[m][k] = bits(float((m + 2 * k) % 7 - 3));
  for (int k = 0; k < K; ++k)
    for (int n = 0; n < W; ++n) o.b[k / 2][2 * n + k % 2] = bits(float((3 * k + n) % 5 - 2));
  for (int m = 0; m < R; ++m)
    for (int n = 0; n < W; ++n) o.c[m][n] = float(m - n);
  const std::vector<float> c = product(o);
  for (int m = 0; m < R; ++m)
    for (int n = 0; n < W; ++n) {
      double want = m - n;
      for (int k = 0; k < K; ++k) want += double((m + 2 * k) % 7 - 3) * double((3 * k + n) % 5 - 2);
      EXPECT_EQ(c[size_t(m) * W + n], float(want)) << "C[" << m << "][" << n << "]";
    }
  Tiles::zero<0>();
  std::vector<float> z(size_t(R) * W, 1.0f);
  Tiles::store<0>(z.data(), W * sizeof(float));
  EXPECT_EQ(z, std::vector<float>(z.size(), 0.0f)) << "zero";

  auto one = [](float c0, float a0, float b0, float a1, float b1) {  // C[0][0] after one pair
    Operands x;
    x.c[0][0] = c0, x.a[0][0] = bits(a0), x.b[0][0] = bits(b0), x.a[0][1] = bits(a1), x.b[0][1] = bits(b1);
    return product(x)[0];
  };
  // 1 + 2^-24 + 2^-24: each addition ties and rounds to even (exactly: 1 + 2^-23).
  EXPECT_EQ(one(1.0f, 0x1p-12f, 0x1p-12f, 0x1p-12f, 0x1p-12f), 1.0f);
  // (1 - 1) + 2^-24: the even pair first (the other order gives 0).
  EXPECT_EQ(one(1.0f, -1.0f, 1.0f, 0x1p-12f, 0x1p-12f), 0x1p-24f);
  // A bf16 denormal (2^-133) times 2^100 reads as 0, not 2^-33.
  Operands d;
  d.a[0][0] = 0x0001, d.b[0][0] = bits(0x1p100f), d.c[0][0] = 0.0f;
  EXPECT_EQ(product(d)[0], 0.0f);
  // 2^-64 x 2^-64 = 2^-128, below fp32's normal range: flushed.
  EXPECT_EQ(one(0.0f, 0x1p-64f, 0x1p-64f, 0.0f, 0.0f), 0.0f);
  EXPECT_EQ(one(0x1p-100f, 0x1p-64f, 0x1p-64f, 0.0f, 0.0f), 0x1p-100f);
}

// The start-up probe's guard: a fault in the guarded code is a return value, the handlers
// in place before are back after, and code that does not fault runs whole.
TEST(FaultGuard, AFaultIsAReturnValue) {
  struct sigaction before = {}, after = {};
  sigaction(SIGILL, nullptr, &before);
  EXPECT_EQ(kernels::run_catching_faults([](void*) { __builtin_trap(); }, nullptr), SIGILL);
  EXPECT_EQ(kernels::run_catching_faults([](void*) { std::raise(SIGSEGV); }, nullptr), SIGSEGV);
  int ran = 0;
  EXPECT_EQ(kernels::run_catching_faults([](void* n) { ++*static_cast<int*>(n); }, &ran), 0);
  EXPECT_EQ(ran, 1);
  sigaction(SIGILL, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler) << "SIGILL's handler not restored";
  EXPECT_NE(std::string(kernels::fault_name(SIGILL)).find("SIGILL"), std::string::npos);
}

// The probe that holds a CPU's tiles to their emulation before the AMX kernel may run:
// the emulation passes it; tiles that add the odd pair first, or fault, are refused with why.
namespace amxt {
struct OddPairFirst : Tiles {
  template <int C, int A, int B>
  static void dpbf16ps() {
    float c[R][W];
    uint16_t a[R][K], b[K / 2][2 * W];
    std::memcpy(c, reg(C).row, sizeof c), std::memcpy(a, reg(A).row, sizeof a), std::memcpy(b, reg(B).row, sizeof b);
    for (int m = 0; m < R; ++m)
      for (int k = 0; k < K / 2; ++k)
        for (int n = 0; n < W; ++n)
          for (int h : {1, 0})
            c[m][n] += kernels::amx::make_fp32(a[m][2 * k + h]) * kernels::amx::make_fp32(b[k][2 * n + h]);
    std::memcpy(reg(C).row, c, sizeof c);
  }
};
struct Faulting : Tiles {
  template <int C, int A, int B>
  static void dpbf16ps() {
    __builtin_trap();
  }
};
}  // namespace amxt

TEST(AmxTiles, ProbeHoldsTheTilesToTheEmulation) {
  using namespace amxt;
  namespace amx = kernels::amx;
  const amx::ProbeIO want = kernels::detail::amx_emulated_probe();
  int nonzero = 0, changed = 0;
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < W; ++n) nonzero += want.out[0][r][n] != 0, changed += want.out[1][r][n] != want.c[r][n];
  EXPECT_GT(nonzero, R * W / 2) << "the probe's first product is mostly zero";
  EXPECT_GT(changed, R * W / 2) << "the probe's second product left C as it was loaded";
  EXPECT_EQ(amx::probe_check<Tiles>(want), "");
  EXPECT_NE(amx::probe_check<OddPairFirst>(want).find("differ from the emulation"), std::string::npos);
  EXPECT_NE(amx::probe_check<Faulting>(want).find("SIGILL"), std::string::npos);
  EXPECT_EQ(amx::probe_check<Tiles>(want), "") << "a probe after a fault";
}

// The AMX kernel on the exact emulation of its tile operations (any host): held to the same
// bound as the AVX512-BF16 path, against the same plain path, with the same blocks and FLOPs.
TEST_P(Bf16AttentionCase, AmxEmulatedWithinPlainBound) {
  const Case& c = GetParam();
  const Bf16Problem p = bf16_problem(c);
  expect_tiles_match_plain(c, p, run_isa(c, p, "amx-emulated"), "amx-emulated");
}

// Where the CPU has AMX: its tiles give the emulation's results bit for bit.
TEST_P(Bf16AttentionCase, AmxMatchesItsEmulationBitForBit) {
  if (const std::string why = kernels::detail::amx_unusable(); !why.empty()) GTEST_SKIP() << "skipped: " << why;
  const Case& c = GetParam();
  const Bf16Problem p = bf16_problem(c);
  const Bf16Out hw = run_isa(c, p, "amx"), emu = run_isa(c, p, "amx-emulated");
  for (const auto& [name, a, b] :
       {std::tuple{"O", &hw.o, &emu.o}, std::tuple{"LSE", &hw.lse, &emu.lse}, std::tuple{"dQ", &hw.dq, &emu.dq},
        std::tuple{"dK", &hw.dk, &emu.dk}, std::tuple{"dV", &hw.dv, &emu.dv}}) {
    size_t differ = 0;
    for (size_t i = 0; i < a->size(); ++i) differ += std::memcmp(&(*a)[i], &(*b)[i], sizeof(double)) != 0;
    EXPECT_EQ(differ, 0u) << name << ": entries where the tiles and their emulation differ";
  }
}

std::vector<Case> bf16_cases() {
  const std::vector<std::string> names = {"causal_d64",     "full_d64",    "causal_d128_gqa",     "kv_heads_1",
                                          "window_lt_tile", "docs_packed", "docs_full",           "s1_decode",
                                          "empty_rows",     "d24_tails",   "default_tiles_ragged"};
  std::vector<Case> out;
  for (const Case& c : cases())
    if (std::find(names.begin(), names.end(), c.name) != names.end()) out.push_back(c);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Kernels, Bf16AttentionCase, ::testing::ValuesIn(bf16_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

TEST(Bf16AttentionIsa, FromCpuFlagsOrForcedPlain) {
  {
    const EnvOverride unset(kIsaVar, nullptr);
    EXPECT_EQ(kernels::attention_isa(), cpu_has_avx512_bf16() ? "avx512_bf16" : "plain");
  }
  const EnvOverride force(kIsaVar, "plain");
  EXPECT_EQ(kernels::attention_isa(), "plain");
  // Forced plain, bf16 attention is the fp32 kernel on the widened inputs, bit for bit.
  const Case c{"plain", 70, 70, 2, 1, 64, true, 0, false, 0, 32};
  Inputs in = make_inputs(c);
  in.q = test::bf16_rounded(in.q), in.k = test::bf16_rounded(in.k), in.v = test::bf16_rounded(in.v);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    kernels::View3<float> o("o", c.Sq, c.H, c.D);
    kernels::View2<float> lse("lse", c.Sq, c.H);
    kernels::attention_fwd<T>(test::make_view<kernels::View3<T>>("q", in.q, c.Sq, c.H, c.D),
                              test::make_view<kernels::View3<T>>("k", in.k, c.Sk, c.Hkv, c.D),
                              test::make_view<kernels::View3<T>>("v", in.v, c.Sk, c.Hkv, c.D), device_mask(in.mask), o,
                              lse);
    return test::to_vec(o);
  };
  EXPECT_EQ(run(bf16{}), run(float{}));
}

TEST(Bf16AttentionIsa, RejectsUnknownValue) {
  const EnvOverride bad(kIsaVar, "sve");
  try {
    kernels::attention_isa();
    FAIL() << "MINICP_ATTENTION_ISA=sve must be refused";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    for (const char* part : {"MINICP_ATTENTION_ISA", "\"sve\"", "plain, avx512_bf16, amx, amx-emulated"})
      EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' missing from: " << msg;
  }
}

// The measured choice: the smallest training-step time per forward FLOP (the backward does
// 2.5x the forward's FLOPs) among the paths that ran; a refused path never wins.
TEST(Bf16AttentionIsa, FastestMeasuredPathWins) {
  using R = kernels::AttnPathRate;
  EXPECT_EQ(kernels::fastest_attention_path({}), "plain");
  EXPECT_EQ(kernels::fastest_attention_path({R{"plain", 100, 100, ""}, R{"avx512_bf16", 150, 50, ""}}), "plain");
  EXPECT_EQ(kernels::fastest_attention_path({R{"plain", 100, 100, ""}, R{"avx512_bf16", 90, 130, ""}}),
            "avx512_bf16");  // 0.0292 against 0.035 s per forward FLOP
  EXPECT_EQ(kernels::fastest_attention_path({R{"plain", 100, 100, ""}, R{"amx", 1e6, 1e6, "start-up check"}}), "plain");
}

// Every path this process can run, timed; the choice set for the run where the variable is
// unset, and the variable still forcing a path over it.
TEST(Bf16AttentionIsa, PathsAreMeasuredAndTheChoiceHolds) {
  const EnvOverride unset(kIsaVar, nullptr);
  const std::vector<kernels::AttnPathRate> rates = kernels::measure_attention_paths(64, 0.001);
  ASSERT_EQ(rates.size(), 3u) << kernels::describe_attention_paths(rates);
  EXPECT_EQ(rates[0].isa, "plain");
  EXPECT_EQ(rates[0].refused, "");
  EXPECT_EQ(rates[1].isa, "avx512_bf16");
  EXPECT_EQ(rates[1].refused, cpu_has_avx512_bf16() ? "" : "this CPU has no avx512_bf16");
  EXPECT_EQ(kernels::attention_paths_here(63)[1].refused,
            cpu_has_avx512_bf16() ? "head_dim 63 is odd" : "this CPU has no avx512_bf16");
  EXPECT_EQ(rates.back().isa, "amx");
  EXPECT_EQ(rates.back().refused,
            kernels::detail::amx_unusable().empty() ? rates.back().refused : kernels::detail::amx_unusable());
  for (const kernels::AttnPathRate& r : rates)
    if (r.refused.empty()) {
      EXPECT_GT(r.fwd_flops_per_s, 1e6) << r.isa;
      EXPECT_GT(r.bwd_flops_per_s, 1e6) << r.isa;
    }
  EXPECT_EQ(kernels::attention_isa(), cpu_has_avx512_bf16() ? "avx512_bf16" : "plain") << "measuring chose nothing";
  kernels::set_attention_isa("plain");
  EXPECT_EQ(kernels::attention_isa(), "plain");
  {
    const EnvOverride force(kIsaVar, "amx-emulated");
    EXPECT_EQ(kernels::attention_isa(), "amx-emulated");
    EXPECT_TRUE(kernels::measure_attention_paths(64, 0.001).empty()) << "a forced path is not measured";
  }
  kernels::set_attention_isa("");
  EXPECT_EQ(kernels::attention_isa(), cpu_has_avx512_bf16() ? "avx512_bf16" : "plain");
}

// amx where this process can run it, refused with the reason where not; amx-emulated anywhere.
TEST(Bf16AttentionIsa, AmxWhereUsableEmulationAnywhere) {
  {
    const EnvOverride emulated(kIsaVar, "amx-emulated");
    EXPECT_EQ(kernels::attention_isa(), "amx-emulated");
  }
  const EnvOverride amx(kIsaVar, "amx");
  const std::string why = kernels::detail::amx_unusable();
  if (why.empty()) {
    EXPECT_EQ(kernels::attention_isa(), "amx");
    return;
  }
  try {
    kernels::attention_isa();
    FAIL() << "MINICP_ATTENTION_ISA=amx accepted where " << why;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

}  // namespace
