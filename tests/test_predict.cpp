// The performance model against the code it describes: the layer's kernel list against the
// FLOP definition, the tile counts against what the attention kernel computes and against a
// tile-by-tile count, every scheme's schedule against the bytes the scheme really sends (run
// on this job's ranks), the table's text form, and the overlap rule on made-up links.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "kernels/attention.hpp"
#include "miniapp/cp/dispatch.hpp"
#include "miniapp/cp/layout.hpp"
#include "miniapp/predict/predict.hpp"
#include "tests/mpi_util.hpp"

namespace {
using namespace minicp;

TEST(PerfModel, LayerOpsMatchLayerFlops) {
  for (const model::Preset& p : model::presets()) {
    for (int64_t N : {1, 64, 1000}) {
      double fwd = 0, bwd = 0;
      for (const predict::LayerOp& op : predict::layer_ops(p.shape, N, false)) fwd += op.flops();
      for (const predict::LayerOp& op : predict::layer_ops(p.shape, N, true)) bwd += op.flops();
      const double want_fwd = model::layer_flops(p.shape, double(N), double(N), true, false, false).gemm;
      const double want_train = model::layer_flops(p.shape, double(N), double(N), true, true, false).gemm;
      EXPECT_DOUBLE_EQ(fwd, want_fwd) << p.name << " N=" << N;
      EXPECT_DOUBLE_EQ(fwd + bwd, want_train) << p.name << " N=" << N;
    }
  }
}

// The model's tile classification must be the kernel's: blocks computed = (full + partial) x H.
TEST(PerfModel, TileCountsMatchTheKernel) {
  struct Case {
    const char* name;
    predict::Spans q, kv;
    cp::Mask mask;
  };
  const int64_t S = 768;
  const Case cases[] = {
      {"zigzag r0 vs r2 (P=3)", layout::zigzag_spans(S, 3, 0), layout::zigzag_spans(S, 3, 2), cp::Mask::causal()},
      {"zigzag r2 vs r0 (P=3)", layout::zigzag_spans(S, 3, 2), layout::zigzag_spans(S, 3, 0), cp::Mask::causal()},
      {"contiguous diagonal", layout::contiguous_spans(S, 2, 1), layout::contiguous_spans(S, 2, 1), cp::Mask::causal()},
      {"striped r1 vs r0", layout::striped_spans(S, 4, 1), layout::striped_spans(S, 4, 0), cp::Mask::causal()},
      {"full mask", layout::contiguous_spans(S, 2, 0), layout::contiguous_spans(S, 2, 1), cp::Mask::full()},
      {"window 200", layout::contiguous_spans(S, 1, 0), layout::contiguous_spans(S, 1, 0), cp::Mask::window(200)},
      {"documents of 300", layout::zigzag_spans(S, 2, 1), layout::zigzag_spans(S, 2, 0),
       cp::Mask::equal_documents(300)},
      {"documents of any length", layout::zigzag_spans(S, 2, 1), layout::zigzag_spans(S, 2, 0),
       cp::Mask::documents({1, 130, 7, 64, 300, 2, 200, 64})},
      {"decode", {{S, 5, 1}}, layout::contiguous_spans(S, 3, 2), cp::Mask::causal()},
  };
  const int H = 2, D = 16;
  for (const Case& c : cases) {
    cp::Config cfg;
    cfg.seq_len = S, cfg.heads = H, cfg.kv_heads = 1, cfg.head_dim = D, cfg.mask = c.mask;
    const auto qp = layout::expand(c.q), kp = layout::expand(c.kv);
    const int64_t nq = int64_t(qp.size()), nk = int64_t(kp.size());
    kernels::View3<double> q("q", nq, H, D), k("k", nk, 1, D), v("v", nk, 1, D), o("o", nq, H, D), dq("dq", nq, H, D),
        dk("dk", nk, 1, D), dv("dv", nk, 1, D);
    kernels::View2<double> lse("lse", nq, H);
    const kernels::AttnMask mask = cp::make_mask(cfg, qp, kp);
    const kernels::AttnStats f = kernels::attention_fwd<double>(q, k, v, mask, o, lse);
    const kernels::AttnStats b = kernels::attention_bwd<double>(q, k, v, o, lse, o, mask, dq, dk, dv);
    const predict::TileCount tf = predict::count_tiles(cfg, c.q, c.kv, kernels::attention_default_tiles(false));
    const predict::TileCount tb = predict::count_tiles(cfg, c.q, c.kv, kernels::attention_default_tiles(true));
    EXPECT_EQ(double(f.blocks_computed), (tf.full + tf.partial) * H) << c.name << " forward";
    EXPECT_EQ(double(b.blocks_computed), (tb.full + tb.partial) * H) << c.name << " backward";
  }
}

// The tile count as it was first written, tile by tile (every tile's bounds listed, each pair
// classified): the reference the closed-form count_tiles must equal.
namespace tile_by_tile {
struct Bounds {
  int64_t pmin, pmax, dmin, dmax, rows;
};
std::vector<Bounds> tile_bounds(const predict::Spans& rows, int b, const cp::Mask& mask) {
  std::vector<Bounds> out;
  Bounds cur{INT64_MAX, INT64_MIN, INT64_MAX, INT64_MIN, 0};
  int64_t in_tile = 0;
  auto doc = [&](int64_t p) { return mask.doc_of(p); };
  for (const predict::Span& sp : rows) {
    int64_t i = 0;
    while (i < sp.count) {
      const int64_t take = std::min<int64_t>(b - in_tile, sp.count - i);
      const int64_t a = sp.at(i), z = sp.at(i + take - 1);  // monotonic within a span
      cur.pmin = std::min({cur.pmin, a, z}), cur.pmax = std::max({cur.pmax, a, z});
      cur.dmin = std::min({cur.dmin, doc(a), doc(z)}), cur.dmax = std::max({cur.dmax, doc(a), doc(z)});
      in_tile += take, cur.rows += take, i += take;
      if (in_tile == b) out.push_back(cur), cur = {INT64_MAX, INT64_MIN, INT64_MAX, INT64_MIN, 0}, in_tile = 0;
    }
  }
  if (in_tile > 0) out.push_back(cur);
  return out;
}
predict::TileCount count(const cp::Config& c, const predict::Spans& q, const predict::Spans& kv,
                         kernels::AttnTiles tiles) {
  const bool causal = c.mask.is_causal();
  const int64_t W = c.mask.window();
  const double whole = double(tiles.q) * tiles.k;
  predict::TileCount n;
  const std::vector<Bounds> qb = tile_bounds(q, tiles.q, c.mask), kb = tile_bounds(kv, tiles.k, c.mask);
  n.q_tiles = double(qb.size()), n.k_tiles = double(kb.size());
  for (const Bounds& a : qb)
    for (const Bounds& k : kb) {
      if (causal && k.pmin > a.pmax) continue;
      if (W > 0 && k.pmax <= a.pmin - W) continue;
      if (k.dmax < a.dmin || k.dmin > a.dmax) continue;
      const bool full = (!causal || k.pmax <= a.pmin) && (W == 0 || k.pmin > a.pmax - W) &&
                        (a.dmin == a.dmax && k.dmin == k.dmax && a.dmin == k.dmin);
      (full ? n.full : n.partial) += 1;
      (full ? n.full_area : n.partial_area) += double(a.rows) * double(k.rows) / whole;
    }
  return n;
}
}  // namespace tile_by_tile

bool same_count(const predict::TileCount& a, const predict::TileCount& b) {
  auto near = [](double x, double y) { return std::abs(x - y) <= 1e-12 * std::max(1.0, std::abs(y)); };
  return near(a.full, b.full) && near(a.partial, b.partial) && near(a.full_area, b.full_area) &&
         near(a.partial_area, b.partial_area) && a.q_tiles == b.q_tiles && a.k_tiles == b.k_tiles;
}
std::string describe(const predict::TileCount& t) {
  return std::to_string(t.full) + " full, " + std::to_string(t.partial) + " partial, areas " +
         std::to_string(t.full_area) + " / " + std::to_string(t.partial_area) + ", tiles " + std::to_string(t.q_tiles) +
         " x " + std::to_string(t.k_tiles);
}
std::string describe(const predict::Spans& s) {
  std::string out;
  for (const predict::Span& sp : s)
    out += "{" + std::to_string(sp.start) + "," + std::to_string(sp.count) + "," + std::to_string(sp.stride) + "}";
  return out;
}

// The rows of a call: a rank's rows in one of the layouts, an all-gather chunk of every
// rank's, a decode step's, or a few spans of random start, stride (negative and 0 too) and count.
predict::Spans random_rows(std::mt19937_64& g) {
  auto U = [&](int64_t a, int64_t b) { return std::uniform_int_distribution<int64_t>(a, b)(g); };
  const int64_t S = U(1, 600);
  const int P = int(U(1, 5)), r = int(U(0, P - 1));
  switch (U(0, 7)) {
    case 0: return layout::zigzag_spans(2 * P * S, P, r);
    case 1: return layout::striped_spans(S, P, r);
    case 2: return layout::contiguous_spans(P * S, P, r);
    case 3: {
      const int R = int(U(1, 3)), Uu = int(U(1, 3));
      return layout::usp_spans(2 * R * Uu * S, R, Uu, int(U(0, R * Uu - 1)));
    }
    case 4: {  // all-gather's chunk k of every rank's two zigzag chunks
      const int64_t half = S / 2 + 1, size = U(1, half), begin = U(0, half - size);
      predict::Spans kv;
      for (int h = 0; h < 2; ++h)
        for (int i = 0; i < P; ++i) kv.push_back({(h == 0 ? i : 2 * P - 1 - i) * half + begin, size, 1});
      return kv;
    }
    case 5: return {{S, U(1, 9), 1}};
    default: break;
  }
  predict::Spans s;
  for (int64_t i = 0, n = U(0, 4); i < n; ++i) {
    const int64_t stride = U(0, 9) == 0 ? 0 : U(-3, 9), count = U(0, 150);
    s.push_back({U(0, 1500) + (stride < 0 ? -stride * count : 0), count, stride});
  }
  return s;
}

// A mask of any kind: windows of a few tokens to unbounded, documents of one length (a token
// to unbounded) or of listed lengths (a token to more than a span).
template <class Uniform>
cp::Mask random_mask(Uniform& U) {
  switch (U(0, 5)) {
    case 0: return cp::Mask::full();
    case 1: return cp::Mask::window(U(0, 1) ? U(1, 50) : U(0, 4) ? U(1, 3000) : INT64_MAX);
    case 2: return cp::Mask::equal_documents(U(0, 1) ? U(1, 20) : U(0, 4) ? U(1, 3000) : INT64_MAX);
    case 3: {
      std::vector<int64_t> lengths;
      for (int64_t at = 0; at < 3000;) lengths.push_back(U(0, 2) ? U(1, 40) : U(1, 900)), at += lengths.back();
      return cp::Mask::documents(lengths);
    }
    default: return cp::Mask::causal();
  }
}

// The closed-form count against the tile-by-tile one on random calls, each way of cutting the
// runs forced in turn, and once more with every position moved by about 2^61 (a multiple of
// doc_len: the same mask), which must not change the count either.
TEST(PerfModel, TileCountsEqualTheTileByTileCount) {
  std::mt19937_64 g(20240613);
  auto U = [&](int64_t a, int64_t b) { return std::uniform_int_distribution<int64_t>(a, b)(g); };
  const predict::TileCut cuts[] = {predict::TileCut::Cheapest, predict::TileCut::QueryResidues,
                                   predict::TileCut::KeyResidues, predict::TileCut::QueryDocuments,
                                   predict::TileCut::KeyDocuments};
  int failures = 0;
  for (int it = 0; it < 3000 && failures < 5; ++it) {
    const predict::Spans q = random_rows(g), kv = random_rows(g);
    cp::Config c;
    c.mask = random_mask(U);
    const kernels::AttnTiles t = U(0, 3) == 0 ? kernels::AttnTiles{int(U(1, 4)), int(U(1, 4))}
                                              : kernels::AttnTiles{int(U(1, 70)), int(U(1, 70))};
    const predict::TileCount want = tile_by_tile::count(c, q, kv, t);
    const int64_t L = c.mask.doc_period(), far = (int64_t(1) << 61) + U(0, 1 << 20), shift = L > 0 ? far / L * L : far;
    const bool listed = !c.mask.doc_starts().empty();  // positions past the list: its last document
    predict::Spans q2 = q, kv2 = kv;
    for (predict::Span& s : q2) s.start += shift;
    for (predict::Span& s : kv2) s.start += shift;
    for (const predict::TileCut cut : cuts)
      for (const bool moved : {false, true}) {
        if (moved && listed) continue;
        const predict::TileCount got =
            moved ? predict::count_tiles(c, q2, kv2, t, cut) : predict::count_tiles(c, q, kv, t, cut);
        if (same_count(got, want)) continue;
        ++failures;
        ADD_FAILURE() << "q " << describe(q) << " kv " << describe(kv) << " tiles " << t.q << "x" << t.k << " mask "
                      << c.mask.describe() << " cut " << int(cut) << (moved ? " moved" : "") << ": " << describe(got)
                      << ", tile by tile " << describe(want);
      }
  }
}

// One counter over many calls keeps the sides it has seen (and sorts the key runs under
// listed documents): every call of a shuffled sequence of pairs, each side seen again and
// again, with the tiles changing between them, must equal the tile-by-tile count.
TEST(PerfModel, ATileCounterOverManyCallsEqualsTheTileByTileCount) {
  std::mt19937_64 g(20261205);
  auto U = [&](int64_t a, int64_t b) { return std::uniform_int_distribution<int64_t>(a, b)(g); };
  int failures = 0;
  for (int round = 0; round < 40 && failures < 5; ++round) {
    cp::Config c;
    c.mask = random_mask(U);
    std::vector<predict::Spans> sides;
    for (int i = 0; i < 6; ++i) sides.push_back(random_rows(g));
    const kernels::AttnTiles tiles[] = {{int(U(1, 70)), int(U(1, 70))}, {int(U(1, 4)), int(U(1, 4))}};
    predict::TileCounter count(c);
    for (int call = 0; call < 60 && failures < 5; ++call) {
      const predict::Spans &q = sides[size_t(U(0, 5))], &kv = sides[size_t(U(0, 5))];
      const kernels::AttnTiles t = tiles[U(0, 4) == 0 ? 1 : 0];
      const predict::TileCount got = count(q, kv, t), want = tile_by_tile::count(c, q, kv, t);
      if (same_count(got, want)) continue;
      ++failures;
      ADD_FAILURE() << "call " << call << ": q " << describe(q) << " kv " << describe(kv) << " tiles " << t.q << "x"
                    << t.k << " mask " << c.mask.describe() << ": " << describe(got) << ", tile by tile "
                    << describe(want);
    }
  }
}

// A 2^40-token sequence in zigzag over 8 ranks, each rank's queries against every rank's keys
// (together: the whole sequence). Tiles of 64 never straddle a chunk, so the query tile of
// global index m sees m whole key tiles and the diagonal one, and the visible (query, key)
// pairs, whole tiles' 64^2 and diagonal tiles' 64*65/2, are sum (q + 1) over the rank's
// queries. Documents of 4096 tokens: the tile sees m mod 64 whole tiles. A count that grew
// with the sequence would not end.
TEST(PerfModel, TileCountsOfA2To40Sequence) {
  const int64_t S = int64_t(1) << 40, b = 64;
  const int P = 8;
  const int64_t C = S / (2 * P) / b;  // tiles per chunk
  using i128 = __int128;
  const auto start = std::chrono::steady_clock::now();
  for (const int64_t doc_len : {int64_t(0), int64_t(4096)}) {
    cp::Config c;
    c.mask = doc_len > 0 ? cp::Mask::equal_documents(doc_len) : cp::Mask::causal();
    for (int r = 0; r < P; ++r) {
      predict::TileCount got;
      for (int s = 0; s < P; ++s) {
        const predict::TileCount t =
            predict::count_tiles(c, layout::zigzag_spans(S, P, r), layout::zigzag_spans(S, P, s), {int(b), int(b)});
        got.full += t.full, got.partial += t.partial, got.full_area += t.full_area, got.partial_area += t.partial_area;
      }
      i128 full = 0, visible = 0;
      for (const int64_t chunk : {int64_t(r), int64_t(2 * P - 1 - r)}) {
        const i128 m0 = i128(chunk) * C, m1 = m0 + C;  // the chunk's tiles [m0, m1)
        full += doc_len == 0 ? (m0 + m1 - 1) * C / 2 : C / 64 * (63 * 64 / 2);
        const i128 q0 = m0 * b, q1 = m1 * b;  // sum of q + 1 over [q0, q1)
        visible += (q0 + 1 + q1) * (q1 - q0) / 2;
      }
      const predict::TileCount want{double(full), double(2 * C), double(full), double(2 * C)};
      EXPECT_TRUE(same_count(got, want)) << "rank " << r << " doc_len " << doc_len << ": " << describe(got)
                                         << ", expected " << describe(want);
      if (doc_len == 0) {
        EXPECT_NEAR(got.full_area * b * b + got.partial_area * b * (b + 1) / 2, double(visible),
                    1e-12 * double(visible))
            << "rank " << r;
      }
    }
  }
  std::printf("count_tiles: 2 x 64 calls at S = 2^40 in %.3f ms\n",
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
}

// Bytes of every call a schedule lists, by the one definition.
int64_t schedule_bytes(const predict::Schedule& s) {
  int64_t b = 0;
  for (const predict::Step& st : s.steps)
    for (const auto* calls : {&st.overlapped, &st.exposed})
      for (const predict::CommCall& c : *calls) b += comm::bytes_leaving(c.op, c.payload, c.group);
  return b;
}

// Each scheme's schedule must account for exactly the bytes the scheme sends on this rank,
// forward and backward, run here on the job's ranks (one node), in T (a bf16 scheme's K/V in
// bf16, its partial results and dK/dV accumulators in fp32, or in bf16 with bf16_dkv).
template <class T>
void schedules_send_what_the_schemes_send(bool bf16_dkv) {
  using A = kernels::acc_t<T>;
  const int P = test::world_size(), r = test::world_rank();
  auto comm = comm::make_mpi_comm(comm::Progress::None);
  const std::string what = std::string(kernels::dtype_name<T>()) + (bf16_dkv ? " bf16_dkv" : "");
  int checked = 0;
  for (const cp::SchemeInfo& info : cp::registry())
    for (const std::string dispatch : {"", "area", "doc-zigzag"}) {  // the layout, then dispatches
      if (!dispatch.empty() && !info.takes_dispatch) continue;
      cp::Config cfg;
      cfg.problem = info.solves(cp::Problem::Train) ? cp::Problem::Train : cp::Problem::Decode;
      cfg.seq_len = 32 * P, cfg.heads = 4, cfg.kv_heads = 2, cfg.head_dim = 8, cfg.ranks = P, cfg.decode_tokens = 3;
      cfg.bf16_dkv = bf16_dkv;
      if (!dispatch.empty()) {  // documents of odd lengths: doc-zigzag's counts differ by rank, area's do not
        cfg.mask = cp::Mask::documents({1, 5 * P + 2, 3, 17 * P - 6, 7 * P, 3 * P});
        cfg.dispatch = dispatch;
        cfg.tokens = std::make_shared<const std::vector<std::vector<int64_t>>>(
            cp::dispatch_tokens(cp::Dispatch::parse(dispatch, 8), cfg.mask, cfg.seq_len, P));
      }
      if (!cp::check(info, cfg).empty()) continue;  // e.g. none at P > 1, ulysses on unequal counts
      const cp::Shard sh = info.shard(cfg, r);
      const int64_t sq = int64_t(sh.q.size()), skv = int64_t(sh.kv.size());
      kernels::View3<T> q("q", sq, 4, 8), k("k", skv, 2, 8), v("v", skv, 2, 8), o("o", sq, 4, 8), dq("dq", sq, 4, 8),
          dk("dk", skv, 2, 8), dv("dv", skv, 2, 8);
      kernels::View2<A> lse("lse", sq, 4);
      Kokkos::deep_copy(q, T(0.1)), Kokkos::deep_copy(k, T(0.2)), Kokkos::deep_copy(v, T(0.3));
      cp::Context ctx{*comm, cfg};
      auto scheme = cp::make_scheme<T>(info);
      const predict::Topo topo{P, P};
      scheme->forward(ctx, q, k, v, o, lse);
      EXPECT_EQ(ctx.bytes_sent(), schedule_bytes(info.schedule(cfg, topo, r, false, sizeof(T))))
          << info.name << " forward, rank " << r << ", " << what << " " << dispatch;
      if (cfg.problem == cp::Problem::Train) {
        ctx.reset();
        scheme->backward(ctx, q, k, v, o, lse, o, dq, dk, dv);
        EXPECT_EQ(ctx.bytes_sent(), schedule_bytes(info.schedule(cfg, topo, r, true, sizeof(T))))
            << info.name << " backward, rank " << r << ", " << what << " " << dispatch;
      }
      ++checked;
    }
  EXPECT_GT(checked, P == 1 ? 0 : 12) << what;
}

TEST(PerfModel, SchedulesSendWhatTheSchemesSend) {
  schedules_send_what_the_schemes_send<double>(false);
  schedules_send_what_the_schemes_send<kernels::bf16>(false);
  schedules_send_what_the_schemes_send<kernels::bf16>(true);
}

// Every scheme, every mask, P = 1..4: the pairs the schedules' calls compute sum to the mask's
// area (counted query by query from keys_of) times the heads, so each visible pair is
// computed exactly once; contiguous ring's area is imbalanced on a causal mask, zigzag's not.
TEST(PerfModel, AttentionAreaSharesTheMaskOnce) {
  const int64_t S = 96;
  const cp::Mask masks[] = {cp::Mask::causal(), cp::Mask::full(), cp::Mask::window(10), cp::Mask::equal_documents(20),
                            cp::Mask::documents({1, 37, 5, 20, 3, 30})};
  int checked = 0;
  for (const cp::SchemeInfo& info : cp::registry())
    for (const cp::Mask& mask : masks)
      for (int P = 1; P <= 4; ++P)
        for (const std::string dispatch : {"", "area", "doc-zigzag"}) {
          if (!dispatch.empty() && !info.takes_dispatch) continue;
          cp::Config c;
          c.seq_len = S, c.heads = 8, c.kv_heads = 2, c.head_dim = 16, c.ranks = P, c.mask = mask, c.decode_tokens = 3;
          c.problem = info.problems.front();
          if (!dispatch.empty())
            c.dispatch = dispatch, c.tokens = std::make_shared<const std::vector<std::vector<int64_t>>>(
                                       cp::dispatch_tokens(cp::Dispatch::parse(dispatch, 8), mask, S, P));
          if (!cp::check(info, c).empty()) continue;
          // Decode: the new tokens (positions S..) against the cache, keys 0..S-1.
          const bool decode = c.problem == cp::Problem::Decode;
          const int64_t q0 = decode ? S : 0, nq = decode ? c.decode_tokens : S;
          double want = 0;
          for (int64_t q = q0; q < q0 + nq; ++q) {
            const auto [lo, hi] = mask.keys_of(q);
            want += double(std::max<int64_t>(0, std::min(hi, S - 1) - lo + 1));
          }
          const std::vector<double> area = predict::attention_area(c, info);
          double got = 0;
          for (double a : area) got += a;
          EXPECT_EQ(got, want * c.heads) << info.name << " P=" << P << " " << mask.describe() << " " << dispatch;
          ++checked;
        }
  EXPECT_GT(checked, 250);
  cp::Config c;
  c.seq_len = 4096, c.heads = 8, c.kv_heads = 8, c.head_dim = 16, c.ranks = 4;
  const std::vector<double> ring = predict::attention_area(c, cp::find("ring"));
  const std::vector<double> zigzag = predict::attention_area(c, cp::find("zigzag"));
  EXPECT_GT(*std::max_element(ring.begin(), ring.end()) / (ring[0] + ring[1] + ring[2] + ring[3]) * 4, 1.5);
  EXPECT_NEAR(*std::max_element(zigzag.begin(), zigzag.end()) / (zigzag[0] + zigzag[1] + zigzag[2] + zigzag[3]) * 4,
              1.0, 0.01);
}

// The tokens a mask needs moved, counted here by hand for contiguous ring at S = 96, P = 4
// (24 tokens a rank): causal, rank r needs the r ranks before it (0+1+2+3 blocks); full, every
// other rank (4 x 3); two documents of 48, rank 1 needs rank 0 and rank 3 rank 2 (2 blocks).
TEST(PerfModel, NeededBytesCountEachSeenKeyOnce) {
  cp::Config c;
  c.seq_len = 96, c.heads = 4, c.kv_heads = 2, c.head_dim = 8, c.ranks = 4;
  const double per_token_train = 2 * 8 * (2 * 4 + 2 * 4), per_token_fwd = 2 * 8 * (2 * 4);
  const cp::SchemeInfo& ring = cp::find("ring");
  EXPECT_EQ(predict::needed_attention_bytes(c, ring, sizeof(float), true), 6 * 24 * per_token_train);
  EXPECT_EQ(predict::needed_attention_bytes(c, ring, sizeof(float), false), 6 * 24 * per_token_fwd);
  c.mask = cp::Mask::full();
  EXPECT_EQ(predict::needed_attention_bytes(c, ring, sizeof(float), false), 12 * 24 * per_token_fwd);
  c.mask = cp::Mask::documents({48, 48});
  EXPECT_EQ(predict::needed_attention_bytes(c, ring, sizeof(float), false), 2 * 24 * per_token_fwd);
  c.ranks = 1;
  EXPECT_EQ(predict::needed_attention_bytes(c, ring, sizeof(float), true), 0.0);
}

// cpu-small's layer shape, as the table rows below spell it.
model::Shape small_ffn() {
  model::Shape s{};
  s.hidden = 1024, s.heads = 8, s.kv_heads = 2, s.head_dim = 128, s.ffn = 2816;
  return s;
}

// The gemm, sgemm and busy rows of the round-tripped table: lookups and a bad busy row.
void check_gemm_and_busy_rows(const predict::Calibration& back) {
  ASSERT_NE(back.find_gemm("f32", 1, "NT", 600, 1000, 3000), nullptr);  // nearest shape
  EXPECT_EQ(back.find_gemm("f64", 1, "NN", 512, 1024, 2816), nullptr);
  EXPECT_EQ(back.sgemm.at(1), 1e11);
  ASSERT_NE(back.find_busy("default", "intra", "allreduce"), nullptr);
  EXPECT_EQ(back.find_busy("default", "intra", "allreduce")->cpu_Bps, 1.3e9);
  EXPECT_EQ(back.find_busy("default", "intra", "p2p"), nullptr);
  EXPECT_THROW(predict::parse_calibration("busy default intra ring 6e8 1e9\n", "x"), std::runtime_error);
}

// The blocking collective rows: kept as written; bad ops, rank counts and times refused.
void check_coll_rows(const predict::Calibration& back) {
  ASSERT_EQ(back.colls.size(), 1u);
  EXPECT_EQ(back.colls[0].op, "alltoall");
  EXPECT_EQ(back.colls[0].payload, 1048576);
  EXPECT_EQ(back.colls[0].seconds, 6.6e-4);
  EXPECT_THROW(predict::parse_calibration("coll default intra sendrecv 2 1024 1e-5\n", "x"), std::runtime_error);
  EXPECT_THROW(predict::parse_calibration("coll default intra alltoall 1 1024 1e-5\n", "x"), std::runtime_error);
  EXPECT_THROW(predict::parse_calibration("coll default intra alltoall 2 1024 0\n", "x"), std::runtime_error);
}

// Posted rows: all-gathers and reduce-scatters, 0 s (all hidden) allowed; kept apart from
// the blocking rows and written back as posted.
void check_posted_rows(const predict::Calibration& back) {
  const predict::Calibration nb = predict::parse_calibration(
      "posted default intra allgather 2 32768 1.5e-3\nposted default intra reduce_scatter 2 32768 0\n", "nb");
  ASSERT_EQ(nb.colls.size(), 2u);
  EXPECT_TRUE(nb.colls[0].posted && nb.colls[1].posted);
  EXPECT_EQ(nb.colls[1].seconds, 0.0);
  EXPECT_EQ(predict::parse_calibration(nb.text(), "again").text(), nb.text());
  EXPECT_NE(nb.text().find("posted default intra allgather 2 32768"), std::string::npos);
  EXPECT_FALSE(back.colls[0].posted);
  EXPECT_THROW(predict::parse_calibration("posted default intra alltoall 2 1024 1e-5\n", "x"), std::runtime_error);
  EXPECT_THROW(predict::parse_calibration("posted default intra allgather 2 1024 -1e-5\n", "x"), std::runtime_error);
}

// The layer rows: found for the same shape within 2x the rows, not for other threads or
// another shape; zero times or rows refused.
void check_layer_rows(const predict::Calibration& back) {
  ASSERT_EQ(back.layers.size(), 1u);
  EXPECT_EQ(back.layers[0].rows, 512);
  EXPECT_EQ(back.layers[0].backward_s, 0.275);
  model::Shape small{};
  small.hidden = 1024, small.heads = 8, small.kv_heads = 2, small.head_dim = 128, small.ffn = 2816;
  EXPECT_NE(back.find_layer("f32", 1, small, 1024), nullptr);  // within 2x
  EXPECT_EQ(back.find_layer("f32", 1, small, 1025), nullptr);
  EXPECT_EQ(back.find_layer("f32", 2, small, 512), nullptr);
  small.ffn = 4096;
  EXPECT_EQ(back.find_layer("f32", 1, small, 512), nullptr);  // another shape
  EXPECT_THROW(predict::parse_calibration("layer f32 1 1024 1024 256 2816 512 0 0.2\n", "x"), std::runtime_error);
  EXPECT_THROW(predict::parse_calibration("layer f32 1 1024 1024 256 2816 0 0.1 0.2\n", "x"), std::runtime_error);
}

// The optional GEMM seconds timed beside the layer: kept, written back; both or none.
void check_layer_gemm_seconds(const predict::Calibration& back) {
  const predict::Calibration g =
      predict::parse_calibration("layer f32 1 1024 1024 256 2816 512 0.145 0.275 0.12 0.24\n", "g");
  ASSERT_EQ(g.layers.size(), 1u);
  EXPECT_EQ(g.layers[0].gemm_forward_s, 0.12);
  EXPECT_EQ(g.layers[0].gemm_backward_s, 0.24);
  EXPECT_EQ(predict::parse_calibration(g.text(), "again").text(), g.text());
  EXPECT_EQ(back.layers[0].gemm_forward_s, 0.0);
  EXPECT_THROW(predict::parse_calibration("layer f32 1 1024 1024 256 2816 512 0.145 0.275 0.12\n", "x"),
               std::runtime_error);
  EXPECT_THROW(predict::parse_calibration("layer f32 1 1024 1024 256 2816 512 0.145 0.275 0 0.2\n", "x"),
               std::runtime_error);
  EXPECT_THROW(predict::parse_calibration("layer f32 1 1024 1024 256 2816 512 0.145 0.275 0.1 x\n", "x"),
               std::runtime_error);
}

// The optional ranks computing at once: kept, written back; a positive integer. The row of
// the asked ranks wins over a nearer row count of other ranks; a row without ranks matches any.
void check_layer_ranks(const predict::Calibration& back) {
  const predict::Calibration r = predict::parse_calibration(
      "layer f32 1 1024 1024 256 2816 512 0.145 0.275 0.12 0.24 2\n"
      "layer f32 1 1024 1024 256 2816 1024 0.3 0.6 0.25 0.5 1\n",
      "r");
  ASSERT_EQ(r.layers.size(), 2u);
  EXPECT_EQ(r.layers[0].ranks, 2);
  EXPECT_EQ(predict::parse_calibration(r.text(), "again").text(), r.text());
  EXPECT_EQ(r.find_layer("f32", 1, small_ffn(), 600, 1), &r.layers[1]);
  EXPECT_EQ(r.find_layer("f32", 1, small_ffn(), 900, 2), &r.layers[0]);
  EXPECT_EQ(r.find_layer("f32", 1, small_ffn(), 600, 4), &r.layers[0]);  // the nearest ranks
  EXPECT_EQ(r.find_layer("f32", 1, small_ffn(), 600, 0), &r.layers[0]);  // any ranks: the nearest rows
  EXPECT_EQ(back.find_layer("f32", 1, small_ffn(), 512, 1), &back.layers[0]);
  for (const char* bad : {"0", "1.5", "x", "2 3"})
    EXPECT_THROW(predict::parse_calibration(
                     std::string("layer f32 1 1024 1024 256 2816 512 0.145 0.275 0.1 0.2 ") + bad + "\n", "x"),
                 std::runtime_error)
        << bad;
}

TEST(PerfModel, TableTextRoundTripsAndBadRowsNameTheLine) {
  const std::string text =
      "# a comment\n"
      "sgemm 1 1e11\n"
      "gemm f32 1 NN 512 1024 2816 9e10\n"
      "attn f32 1 fwd 128 256 128 2e-6 3e-6 1e-5\n"
      "elem f32 1 copy 1e-10\n"
      "link default intra 4e-6 1.8e10 1.8e10\n"
      "busy default intra allreduce 6e8 1.3e9\n"
      "coll default intra alltoall 2 1048576 6.6e-4\n"
      "layer f32 1 1024 1024 256 2816 512 0.145 0.275\n"
      "info host vm\n";
  const predict::Calibration c = predict::parse_calibration(text, "t.txt");
  const predict::Calibration back = predict::parse_calibration(c.text(), "again");
  EXPECT_EQ(back.text(), c.text());
  // A failed ASSERT returns from its helper only: stop here too, so later checks are skipped.
  for (auto check : {check_gemm_and_busy_rows, check_coll_rows, check_posted_rows, check_layer_rows,
                     check_layer_gemm_seconds, check_layer_ranks}) {
    check(back);
    if (::testing::Test::HasFatalFailure()) return;
  }
  try {
    predict::parse_calibration("sgemm 1 1e11\ngemm f32 1 NN 512 -3 2816 9e10\n", "bad.txt");
    FAIL() << "a negative size was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.txt:2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(predict::parse_calibration("gemmm f32\n", "x"), std::runtime_error);
}

// An attention row's optional columns: TOUCHED, then ITEM; a row without them reads 0, a
// negative one is refused, and the written text keeps both.
TEST(PerfModel, AttentionRowsReadTheirOptionalColumns) {
  const predict::Calibration c = predict::parse_calibration(
      "attn f32 1 fwd 128 256 128 2e-6 3e-6 1e-5\n"
      "attn f32 1 bwd 128 128 128 2e-6 3e-6 1e-5 4e-7\n"
      "attn f32 2 bwd 128 128 128 2e-6 3e-6 1e-5 4e-7 5e-6\n",
      "t.txt");
  ASSERT_EQ(c.attn.size(), 3u);
  EXPECT_EQ(c.attn[0].tile_s, 0.0);
  EXPECT_EQ(c.attn[0].item_s, 0.0);
  EXPECT_EQ(c.attn[1].tile_s, 4e-7);
  EXPECT_EQ(c.attn[1].item_s, 0.0);
  EXPECT_EQ(c.attn[2].item_s, 5e-6);
  const predict::Calibration back = predict::parse_calibration(c.text(), "again");
  EXPECT_EQ(back.attn[2].item_s, 5e-6);
  EXPECT_EQ(back.text(), c.text());
  EXPECT_THROW(predict::parse_calibration("attn f32 1 bwd 128 128 128 2e-6 3e-6 1e-5 4e-7 -1\n", "x"),
               std::runtime_error);
}

// The overlap rule: with an instant link the step is the compute alone, a slower link never
// makes a step faster, and a link whose CPU copies the traffic costs at least that copy.
// The tiny layers' training step at S = 4096 on P ranks of one node, with a small table.
struct TinyCase {
  model::StackConfig sc;
  predict::Machine m;
  explicit TinyCase(int P) {
    sc.shape = *model::find_preset("tiny");
    sc.pass = model::Pass::Train;
    sc.attn.seq_len = 4096, sc.attn.ranks = P;
    m.cal = predict::parse_calibration(
        "sgemm 1 1e11\ngemm f32 1 NN 64 64 64 1e10\nattn f32 1 fwd 16 256 128 1e-6 2e-6 1e-6\n"
        "attn f32 1 bwd 16 128 128 2e-6 3e-6 1e-6\nelem f32 1 copy 1e-9\n",
        "t");
    m.threads = 1, m.topo = {P, P};
  }
};

TEST(PerfModel, StepGrowsWithTheLinkAndHidesBehindCompute) {
  TinyCase tiny(4);
  auto& [sc, m] = tiny;
  auto step = [&](double alpha, double beta, double cpu) {
    m.intra = m.inter = {alpha, beta, cpu, "t", 0, {}, {}, {}};
    return predict::predict_step(sc, cp::find("zigzag"), m, sizeof(float)).step_s;
  };
  const double instant = step(0, 1e30, 0), fast = step(1e-6, 1e10, 0), slow = step(1e-5, 1e8, 0);
  EXPECT_LE(instant, fast);
  EXPECT_LT(fast, slow);
  EXPECT_GT(step(1e-6, 1e10, 1e9), fast);  // the CPU's copy comes out of compute
  // Beside compute (busy rows): a slower wire or a costlier one never makes a step faster.
  auto busy = [&](double wire, double cpu) {
    m.intra = m.inter = {1e-6, 1e10, 0, "t", 0, {wire, cpu}, {wire, cpu}, {}};
    return predict::predict_step(sc, cp::find("zigzag"), m, sizeof(float)).step_s;
  };
  EXPECT_NEAR(busy(1e10, 0), fast, 1e-9 * fast);  // as fast as alone, and free: the link alone
  EXPECT_LT(busy(1e10, 0), busy(1e8, 0));
  EXPECT_LT(busy(1e10, 0), busy(1e10, 1e8));
  const predict::Prediction p = predict::predict_step(sc, cp::find("zigzag"), m, sizeof(float));
  double phases = 0;
  for (double s : p.phase_s) phases += s;
  EXPECT_NEAR(phases, p.step_s, 1e-9 * p.step_s);  // the phases account for the step
}

// With run.tp_overlap each TP collective hides behind the GEMMs that run beside it (model::
// tp_calls' beside_flops: an all-gather's GEMMs on the rank's own rows, 1/tp of them; a
// backward reduce's weight-gradient GEMMs), never more than its own time. The FLOPs are the
// closed form; on a link slow enough that every collective outlasts its GEMMs the step saves
// exactly their time; on a fast one only the collectives with nothing beside them are left.
TEST(PerfModel, TpOverlapHidesTheGemmsBesideEachCollective) {
  TinyCase tiny(1);
  auto& [sc, m] = tiny;
  sc.mesh = comm::Mesh(2, 1, 1);
  m.topo = {2, 2};
  const int64_t N = sc.attn.seq_len, C = sc.shape.hidden, D = sc.shape.head_dim, L = sc.shape.layers;
  const double H = sc.shape.heads / 2, Hkv = sc.shape.kv_heads / 2, F = sc.shape.ffn / 2;  // one TP rank's
  const double qkv = 2.0 * N * C * (H + 2 * Hkv) * D, mlp = 4.0 * N * C * F, o = 4.0 * N * C * H * D;
  auto beside = [&](bool bwd) {
    double f = 0;
    for (const model::TpCall& c : model::tp_calls(sc, N, bwd, sizeof(float))) f += c.beside_flops;
    return f;
  };
  EXPECT_EQ(beside(false) + beside(true), 0.0) << "without tp_overlap nothing runs beside";
  auto predict = [&](double alpha, double beta, bool overlap) {
    sc.tp_overlap = overlap;
    m.intra = m.inter = {alpha, beta, 0, "t", 0, {}, {}, {}};
    return predict::predict_step(sc, cp::find("none"), m, sizeof(float));
  };
  const predict::Prediction off = predict(1e-4, 1e6, false), on = predict(1e-4, 1e6, true);
  EXPECT_DOUBLE_EQ(beside(false), (qkv + mlp) / 2);           // h1 and h2 gathered
  EXPECT_DOUBLE_EQ(beside(true), (mlp + o) / 2 + mlp + qkv);  // dy, dx2 gathered; dh reduced twice
  // Every QKV phase second is a GEMM's (3 forward, 6 backward, qkv FLOPs every 3).
  const double s_per_flop = on.phase_s[int(model::Phase::Qkv)] / (L * 3 * qkv);
  const double hidden = L * (beside(false) + beside(true)) * s_per_flop;
  const int tp = int(model::Phase::TpComm);
  EXPECT_GT(hidden, 0.0);
  EXPECT_NEAR(off.phase_s[tp] - on.phase_s[tp], hidden, 1e-9 * off.step_s);
  EXPECT_NEAR(off.step_s - on.step_s, hidden, 1e-9 * off.step_s);
  const predict::Prediction fast = predict(1e-7, 1e12, true);
  double left = 0;  // the forward's reduce-scatters, the norms' gradients
  for (const bool bwd : {false, true})
    for (const model::TpCall& c : model::tp_calls(sc, N, bwd, sizeof(float)))
      if (c.beside_flops == 0) left += L * predict::exposed_seconds({c.op, c.payload, c.group, false}, m.intra);
  EXPECT_GT(left, 0.0);
  EXPECT_NEAR(fast.phase_s[tp], left, 1e-9 * fast.step_s);
}

// A transfer beside compute: what moves while the compute runs slows it by its share of the
// loss; the rest moves after at the link's own rate.
TEST(PerfModel, TransferBesideComputeCostsItsShare) {
  // Covered: 1 s of compute, 0.5 s of transfer beside it costing 0.2 s of compute.
  auto [c1, w1] = predict::overlap(1.0, 0.1, {0.5, 0.2});
  EXPECT_DOUBLE_EQ(c1, 1.2);
  EXPECT_DOUBLE_EQ(w1, 0.5);
  // Not covered: a quarter moves beside 1 s of compute (0.25 x 0.4 s lost), the other three
  // quarters after, at 0.8 s for the whole alone.
  auto [c2, w2] = predict::overlap(1.0, 0.8, {4.0, 0.4});
  EXPECT_DOUBLE_EQ(c2, 1.1);
  EXPECT_DOUBLE_EQ(w2, 1.1 + 0.75 * 0.8);
  auto [c3, w3] = predict::overlap(1.0, 0, {0, 0});  // nothing to move
  EXPECT_DOUBLE_EQ(c3, 1.0);
  EXPECT_DOUBLE_EQ(w3, 0.0);
}

// A blocking collective the step waits for: the measured time at its size, linear between
// two measured sizes, scaled as alpha-beta scales it beyond them, alpha-beta without rows of
// its op and group; the last row of one size wins.
TEST(PerfModel, ExposedCallsTakeTheirMeasuredTime) {
  predict::Link l{1e-5, 1e9, 1e9, "t", 0, {}, {}, {}};
  const predict::CommCall a2a{comm::EventKind::AllToAll, 1 << 20, 2, false};
  const double ab = predict::comm_seconds(a2a, l);
  EXPECT_DOUBLE_EQ(predict::exposed_seconds(a2a, l), ab);  // no rows
  l.colls = {{"f", "intra", "alltoall", 2, 1 << 18, 2e-4},
             {"f", "intra", "alltoall", 2, 1 << 20, 9e-4},
             {"f", "intra", "alltoall", 4, 1 << 20, 5e-3},
             {"f", "intra", "allgather", 2, 1 << 20, 7e-3}};
  EXPECT_DOUBLE_EQ(predict::exposed_seconds(a2a, l), 9e-4);
  EXPECT_DOUBLE_EQ(predict::exposed_seconds({comm::EventKind::AllToAll, 1 << 20, 4, false}, l), 5e-3);
  const int64_t mid = (1 << 18) + ((1 << 20) - (1 << 18)) / 4;  // a quarter of the way
  EXPECT_DOUBLE_EQ(predict::exposed_seconds({comm::EventKind::AllToAll, mid, 2, false}, l), 2e-4 + 0.25 * 7e-4);
  const predict::CommCall big{comm::EventKind::AllToAll, 1 << 22, 2, false};
  EXPECT_DOUBLE_EQ(predict::exposed_seconds(big, l), 9e-4 * predict::comm_seconds(big, l) / ab);
  const predict::CommCall rs{comm::EventKind::ReduceScatter, 1 << 20, 2, false};
  EXPECT_DOUBLE_EQ(predict::exposed_seconds(rs, l), predict::comm_seconds(rs, l));
  l.colls.push_back({"f", "intra", "alltoall", 2, 1 << 20, 1.5e-3});  // measured again
  EXPECT_DOUBLE_EQ(predict::exposed_seconds(a2a, l), 1.5e-3);
}

// The predicted phases of the layer's kernels other than attention.
double layer_kernels_s(const predict::Prediction& p) {
  return p.phase_s[int(model::Phase::Mlp)] + p.phase_s[int(model::Phase::Qkv)] + p.phase_s[int(model::Phase::Norm)] +
         p.phase_s[int(model::Phase::Rope)] + p.phase_s[int(model::Phase::OutProj)];
}

// A layer row scales the layer's kernels (not attention, not comm) by what it measured over
// the kernels' own rates, at row counts within 2x of its own.
TEST(PerfModel, LayerRowsScaleTheLayerKernels) {
  TinyCase tiny(2);
  auto& [sc, m] = tiny;
  m.intra = m.inter = {1e-6, 1e10, 0, "t", 0, {}, {}, {}};
  const int64_t N = sc.attn.seq_len / sc.attn.ranks;
  const model::Shape& s = sc.shape;
  const predict::Prediction plain = predict::predict_step(sc, cp::find("zigzag"), m, sizeof(float));
  double own[2] = {0, 0}, elem[2] = {0, 0};  // one layer's kernels at the table's own rates; its element-wise part
  for (int b = 0; b < 2; ++b)
    for (const predict::LayerOp& op : predict::layer_ops(s, N, b == 1))
      if (op.ops.empty()) {
        const predict::ElemRate* e = m.cal.find_elem("f32", 1, op.elem);  // the model's 0 s when the table has none
        own[b] += e ? e->s_per_value * op.values : 0.0;
        elem[b] += e ? e->s_per_value * op.values : 0.0;
      } else {
        own[b] += op.flops() / m.cal.find_gemm("f32", 1, op.ops, op.m, op.n, op.k)->flops_per_s;
      }
  auto with_row = [&](int64_t rows, double fwd_x, double bwd_x) {
    predict::Machine r = m;
    r.cal.layers.push_back({"f32", 1, s.hidden, int64_t(s.heads) * s.head_dim, int64_t(s.kv_heads) * s.head_dim, s.ffn,
                            rows, fwd_x * own[0], bwd_x * own[1]});
    return r;
  };
  const predict::Machine twice = with_row(N, 2.0, 1.5);
  EXPECT_DOUBLE_EQ(predict::layer_factor(s, N, false, 0, twice, sizeof(float)), 2.0);
  EXPECT_DOUBLE_EQ(predict::layer_factor(s, N, true, 0, twice, sizeof(float)), 1.5);
  const predict::Prediction p = predict::predict_step(sc, cp::find("zigzag"), twice, sizeof(float));
  const double kernels = s.layers * (own[0] + own[1]);
  EXPECT_NEAR(layer_kernels_s(plain), kernels, 1e-9 * kernels);
  EXPECT_NEAR(p.step_s - plain.step_s, s.layers * (own[0] + 0.5 * own[1]), 1e-6 * p.step_s);
  EXPECT_DOUBLE_EQ(p.attn_compute_s, plain.attn_compute_s);
  // A row more than 2x away in rows is not used.
  EXPECT_DOUBLE_EQ(predict::predict_step(sc, cp::find("zigzag"), with_row(4 * N, 2.0, 2.0), sizeof(float)).step_s,
                   plain.step_s);
  EXPECT_DOUBLE_EQ(predict::layer_factor(s, N, false, 0, m, sizeof(float)), 1.0);
  // With the GEMMs timed beside the layer, the factor is the layer over those GEMMs and the
  // element-wise kernels at the table's rates, whatever the table's GEMM rates say: a row
  // measured while the host ran 1.6x slower gives the factor of its own moment.
  const double gemm[2] = {own[0] - elem[0], own[1] - elem[1]};
  ASSERT_GT(gemm[0], 0);
  for (double slow : {1.0, 1.6}) {
    predict::Machine r = m;
    r.cal.layers.push_back({"f32", 1, s.hidden, int64_t(s.heads) * s.head_dim, int64_t(s.kv_heads) * s.head_dim, s.ffn,
                            N, 1.2 * (slow * gemm[0] + elem[0]), 0.9 * (slow * gemm[1] + elem[1]), slow * gemm[0],
                            slow * gemm[1]});
    EXPECT_NEAR(predict::layer_factor(s, N, false, 0, r, sizeof(float)), 1.2, 1e-12) << "host " << slow << "x slower";
    EXPECT_NEAR(predict::layer_factor(s, N, true, 0, r, sizeof(float)), 0.9, 1e-12) << "host " << slow << "x slower";
  }
  // Rows measured with 1 and with 2 ranks computing: a case takes the row of the ranks that
  // compute at once on its host (its ranks, at most the ranks per node).
  predict::Machine two = m;
  auto add = [&](double x, int ranks) {
    two.cal.layers.push_back({"f32", 1, s.hidden, int64_t(s.heads) * s.head_dim, int64_t(s.kv_heads) * s.head_dim,
                              s.ffn, N, x * own[0], x * own[1], gemm[0], gemm[1], ranks});
  };
  add(1.0, 1), add(2.0, 2);
  const double f1 = predict::layer_factor(s, N, false, 1, two, sizeof(float));
  const double f2 = predict::layer_factor(s, N, false, 2, two, sizeof(float));
  EXPECT_NEAR(f2, 2 * f1, 1e-12);
  const double on_two = predict::predict_step(sc, cp::find("zigzag"), two, sizeof(float)).step_s;
  two.topo.ranks_per_node = 1;  // the same 2 ranks, one per node: one computes on each host
  const double on_one = predict::predict_step(sc, cp::find("zigzag"), two, sizeof(float)).step_s;
  EXPECT_GT(on_two - on_one, 0.9 * s.layers * (f2 - f1) * gemm[0]);
}

// A step's non-blocking all-gathers and reduce-scatters with posted rows on their link cost
// the rows' seconds each, not hidden by the compute (the allgather scheme: per layer 12 such
// gathers forward, 12 gathers and 12 reduce-scatters backward at P = 2, chunks 4); without
// rows they move beside compute as before; a blocking row of the same op does not count.
TEST(PerfModel, PostedCallsCostTheirRowsPerCall) {
  TinyCase tiny(2);
  auto& [sc, m] = tiny;
  m.intra = m.inter = {1e-6, 1e10, 0, "t", 0, {}, {}, {}};
  const cp::SchemeInfo& ag = cp::find("allgather");
  const predict::Prediction plain = predict::predict_step(sc, ag, m, sizeof(float));
  int calls[2] = {0, 0};  // posted calls per layer, forward and backward, rank 0's schedule
  const cp::Config c = model::attention_config(sc);
  for (int b = 0; b < 2; ++b)
    for (const predict::Step& st : ag.schedule(c, m.topo, 0, b == 1, sizeof(float)).steps)
      for (const predict::CommCall& cc : st.overlapped) calls[b] += predict::posted_op(cc.op) ? 1 : 0;
  EXPECT_EQ(calls[0], 4 * (c.setting("chunks") - 1));
  EXPECT_EQ(calls[1], 8 * (c.setting("chunks") - 1));
  auto with = [&](double ag_s, double rs_s, bool posted) {
    predict::Machine r = m;
    for (const int64_t payload : {int64_t(1), int64_t(1) << 40})  // every call's size between two rows
      for (auto [op, s] : {std::pair{"allgather", ag_s}, std::pair{"reduce_scatter", rs_s}}) {
        predict::CollTime t{"t", "intra", op, 2, payload, s};
        t.posted = posted;
        r.intra.colls.push_back(t);
      }
    return predict::predict_step(sc, ag, r, sizeof(float));
  };
  const predict::Prediction zero = with(0, 0, true), some = with(1e-3, 2e-3, true);
  const int L = sc.shape.layers;
  // The gathers of the backward's steps before the last: as many as the reduce-scatters.
  EXPECT_NEAR(some.forward_s - zero.forward_s, L * calls[0] * 1e-3, 1e-9);
  EXPECT_NEAR(some.step_s - zero.step_s, L * (calls[0] * 1e-3 + calls[1] / 2 * (1e-3 + 2e-3)), 1e-6);
  EXPECT_LE(zero.step_s, plain.step_s + 1e-12);  // with rows of 0 s nothing moves beside compute
  EXPECT_GT(some.exposed_attn_comm_s, zero.exposed_attn_comm_s);
  // Blocking rows (the exposed calls') leave the overlapped ones beside compute.
  predict::Link blocking = m.intra;
  blocking.colls.push_back({"t", "intra", "allgather", 2, 1024, 1e-3});
  const predict::CommCall gather{comm::EventKind::AllGather, 1024, 2, false};
  EXPECT_EQ(predict::posted_seconds(gather, blocking), -1.0);
  EXPECT_DOUBLE_EQ(predict::exposed_seconds(gather, blocking), 1e-3);
  predict::CollTime posted{"t", "intra", "allgather", 2, 1024, 4e-4};
  posted.posted = true;
  blocking.colls.push_back(posted);
  EXPECT_DOUBLE_EQ(predict::posted_seconds(gather, blocking), 4e-4);
  EXPECT_DOUBLE_EQ(predict::exposed_seconds(gather, blocking), 1e-3);
  EXPECT_EQ(predict::posted_seconds({comm::EventKind::SendRecv, 1024, 2, false}, blocking), -1.0);
}

// Rows of the run's own table hold the run's speed: at the row's N the layer's kernels take
// the row's seconds whatever the drift scale and the table's GEMM rates (one of them read 2x
// slow), at another N the row scaled as the table's kernels scale. A table from another run
// follows the drift scale.
TEST(PerfModel, RowsOfTheRunKeepTheRunsSpeed) {
  TinyCase tiny(2);
  auto& [sc, m] = tiny;
  m.intra = m.inter = {1e-6, 1e10, 0, "t", 0, {}, {}, {}};
  const int64_t N = sc.attn.seq_len / sc.attn.ranks;
  const model::Shape& s = sc.shape;
  const double row[2] = {3e-3, 7e-3};  // one layer, forward and backward, as the run measured it
  predict::Machine r = m;
  r.cal.layers.push_back({"f32", 1, s.hidden, int64_t(s.heads) * s.head_dim, int64_t(s.kv_heads) * s.head_dim, s.ffn, N,
                          row[0], row[1], 1e-3, 2e-3, 2});
  r.cal.of_the_run = true;
  for (predict::GemmRate& g : r.cal.gemm)
    if (g.ops == "NN") g.flops_per_s /= 2;  // a reading at a slow moment
  for (double scale : {1.0, 1.12}) {
    r.rate_scale = scale;
    const predict::Prediction p = predict::predict_step(sc, cp::find("zigzag"), r, sizeof(float));
    EXPECT_NEAR(layer_kernels_s(p), s.layers * (row[0] + row[1]), 1e-9) << "drift scale " << scale;
  }
  // Twice the rows: the row scaled as the table's kernels scale from N to 2N.
  r.rate_scale = 1;
  model::StackConfig twice = sc;
  twice.attn.seq_len *= 2;
  const double own_n = predict::predict_step(sc, cp::find("zigzag"), m, sizeof(float)).phase_s[int(model::Phase::Mlp)];
  const double own_2n =
      predict::predict_step(twice, cp::find("zigzag"), m, sizeof(float)).phase_s[int(model::Phase::Mlp)];
  const double mlp_n = predict::predict_step(sc, cp::find("zigzag"), r, sizeof(float)).phase_s[int(model::Phase::Mlp)];
  const double mlp_2n =
      predict::predict_step(twice, cp::find("zigzag"), r, sizeof(float)).phase_s[int(model::Phase::Mlp)];
  EXPECT_NEAR(mlp_2n / mlp_n, own_2n / own_n, 1e-9);
  // Another run's table: the drift scale applies to its rows.
  r.cal.of_the_run = false;
  r.rate_scale = 1;
  const double at1 = layer_kernels_s(predict::predict_step(sc, cp::find("zigzag"), r, sizeof(float)));
  r.rate_scale = 1.25;
  EXPECT_NEAR(layer_kernels_s(predict::predict_step(sc, cp::find("zigzag"), r, sizeof(float))), at1 / 1.25, 1e-9 * at1);
}

// Samples of one row (pieces, rounds) become one row per shape, rows and ranks: per pass the
// sample whose layer over its GEMMs is the median, whatever the host's speed of each sample.
TEST(PerfModel, MedianLayerRowsTakeTheMedianRatioPerPass) {
  auto row = [](int64_t rows, int ranks, double fwd, double bwd, double gf, double gb) {
    return predict::LayerTime{"f32", 1, 1024, 1024, 256, 2816, rows, fwd, bwd, gf, gb, ranks};
  };
  // Forward ratios 1.5, 1.1 (at half speed), 1.2: the median 1.2; backward 1.0, 1.3, 2.0: 1.3.
  const std::vector<predict::LayerTime> samples = {row(512, 2, 0.15, 0.2, 0.1, 0.2), row(4, 2, 0.004, 0, 0.004, 0),
                                                   row(512, 2, 0.44, 0.52, 0.4, 0.4), row(512, 1, 0.1, 0.2, 0.1, 0.2),
                                                   row(512, 2, 0.12, 0.4, 0.1, 0.2)};
  const std::vector<predict::LayerTime> m = predict::median_layer_rows(samples);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].rows, 512);
  EXPECT_EQ(m[0].ranks, 2);
  EXPECT_DOUBLE_EQ(m[0].forward_s, 0.12);
  EXPECT_DOUBLE_EQ(m[0].gemm_forward_s, 0.1);
  EXPECT_DOUBLE_EQ(m[0].backward_s, 0.52);
  EXPECT_DOUBLE_EQ(m[0].gemm_backward_s, 0.4);
  EXPECT_EQ(m[1].rows, 4);
  EXPECT_DOUBLE_EQ(m[1].forward_s, 0.004);
  EXPECT_DOUBLE_EQ(m[1].backward_s, 0.0);
  EXPECT_EQ(m[2].ranks, 1);
  EXPECT_DOUBLE_EQ(m[2].forward_s, 0.1);
}

// A scheme whose attention waits for all-to-alls (ulysses) predicts a longer step when the
// table measures them slower, and the difference is those calls' time.
TEST(PerfModel, SlowerCollectivesSlowTheirSchemesOnly) {
  TinyCase tiny(2);
  auto& [sc, m] = tiny;
  m.intra = m.inter = {1e-6, 1e10, 0, "t", 0, {}, {}, {}};
  auto step = [&](const char* scheme, double per_call) {
    m.intra.colls.clear();
    for (const char* op : {"alltoall", "allreduce"})
      for (int64_t b : {8, 1 << 10, 1 << 20}) m.intra.colls.push_back({"t", "intra", op, 2, b, per_call});
    m.inter = m.intra;
    return predict::predict_step(sc, cp::find(scheme), m, sizeof(float)).step_s;
  };
  const double fast = step("ulysses", 1e-5), slow = step("ulysses", 1e-3);
  EXPECT_GT(slow, fast);
  // ulysses at P = 2: per layer 5 calls in the forward, 5 in the backward, 2 layers (each call
  // at or between measured sizes of one time: exactly per_call)
  EXPECT_NEAR(slow - fast, 2 * (5 + 5) * (1e-3 - 1e-5), 1e-9);
  EXPECT_NEAR(step("zigzag", 1e-3) - step("zigzag", 1e-5), 2 * 1 * (1e-3 - 1e-5), 1e-9);  // its one small all-reduce
}

// The tiny table of TinyCase with bf16 rows `x` times as fast as its f32 ones.
predict::Calibration with_bf16_rows(const predict::Calibration& f32, double x) {
  predict::Calibration c = f32;
  for (predict::GemmRate g : f32.gemm) g.dtype = "bf16", g.flops_per_s *= x, c.gemm.push_back(g);
  for (predict::AttnRate a : f32.attn) {
    a.dtype = "bf16", a.full_s /= x, a.partial_s /= x, a.call_s /= x, a.tile_s /= x;
    c.attn.push_back(a);
  }
  for (predict::ElemRate e : f32.elem) e.dtype = "bf16", e.s_per_value /= x, c.elem.push_back(e);
  return c;
}

// A bf16 case (2-byte values) takes the table's bf16 rows: with them twice as fast as the
// f32 rows, its compute (the layer's kernels, attention, merges) is half the f32 case's.
TEST(PerfModel, Bf16CasesTakeTheBf16Rows) {
  TinyCase tiny(2);
  auto& [sc, m] = tiny;
  m.intra = m.inter = {0, 1e30, 0, "t", 0, {}, {}, {}};  // an instant link: compute alone
  m.cal = with_bf16_rows(m.cal, 2.0);
  const predict::Prediction f32 = predict::predict_step(sc, cp::find("zigzag"), m, sizeof(float));
  const predict::Prediction bf16 = predict::predict_step(sc, cp::find("zigzag"), m, sizeof(kernels::bf16));
  ASSERT_GT(f32.attn_compute_s, 0);
  EXPECT_NEAR(layer_kernels_s(bf16), 0.5 * layer_kernels_s(f32), 1e-9 * layer_kernels_s(f32));
  EXPECT_NEAR(bf16.attn_compute_s, 0.5 * f32.attn_compute_s, 1e-9 * f32.attn_compute_s);
  EXPECT_NEAR(bf16.step_s, 0.5 * f32.step_s, 1e-6 * f32.step_s);
}

// What a bf16 case moves: a ring step's K/V in bf16 (half an f32 step's bytes); the dK/dV
// accumulators of its backward in fp32 (an f32 step's bytes), in bf16 with bf16_dkv (half);
// the weight gradients all-reduced in fp32 (the f32 case's bytes and time), in bf16 with
// bf16_grad_allreduce (half).
TEST(PerfModel, Bf16CasesMoveBf16ValuesAndFp32Sums) {
  const int P = 4;
  TinyCase tiny(P);
  auto& [sc, m] = tiny;
  m.cal = with_bf16_rows(m.cal, 1.0);
  const cp::Config c = model::attention_config(sc);
  cp::Config narrow = c;
  narrow.bf16_dkv = true;
  // The send-receives of rank 0's ring steps: forward K/V blocks; backward K/V blocks and the
  // dK/dV accumulators of the P - 1 blocks not its own, going home.
  auto sends = [&](const cp::Config& cfg, bool backward, size_t elem) {
    std::vector<int64_t> out;
    for (const predict::Step& st : cp::find("ring").schedule(cfg, m.topo, 0, backward, elem).steps)
      for (const predict::CommCall& cc : st.overlapped)
        if (cc.op == comm::EventKind::SendRecv) out.push_back(cc.payload);
    return out;
  };
  const std::vector<int64_t> f32 = sends(c, false, 4), f16 = sends(c, false, 2);
  ASSERT_EQ(f32.size(), size_t(P - 1));
  const int64_t kv = f32.front();  // a K/V block in f32
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_EQ(f16.at(i), kv / 2) << "forward send " << i;
  int kv_blocks = 0, sums = 0;
  for (int64_t b : sends(c, true, 2)) {
    kv_blocks += b == kv / 2 ? 1 : 0;  // K/V in bf16
    sums += b == kv ? 1 : 0;           // dK/dV in fp32
  }
  EXPECT_EQ(sums, P - 1);
  EXPECT_EQ(kv_blocks, P - 2);
  for (int64_t b : sends(c, true, 4)) EXPECT_EQ(b, kv);
  for (int64_t b : sends(narrow, true, 2)) EXPECT_EQ(b, kv / 2);  // bf16_dkv: the sums in bf16
  // The weight gradients over a link whose all-reduce crawls (1 B/s), so that nothing of them
  // hides behind the backward: the exposed time is their bytes'.
  m.intra = m.inter = {0, 1e30, 0, "t", 1.0, {}, {}, {}};
  auto grads = [&](size_t elem, bool bf16_grads) {
    model::StackConfig s = sc;
    s.bf16_grad_allreduce = bf16_grads;
    return predict::predict_step(s, cp::find("zigzag"), m, elem).grad_allreduce_exposed_s;
  };
  const double g32 = grads(4, false);
  ASSERT_GT(g32, 0);
  EXPECT_NEAR(grads(2, false), g32, 1e-6 * g32);
  EXPECT_NEAR(grads(2, true), 0.5 * g32, 1e-6 * g32);
}

// An attention head_dim the table has no rows of takes the rows of the nearest head_dim,
// scaled by the head_dims' ratio, and says so in the prediction's notes; rows of its own
// head_dim are taken as they are, without a note.
TEST(PerfModel, AnotherHeadDimTakesTheNearestRowsAndSaysSo) {
  TinyCase tiny(2);
  auto& [sc, m] = tiny;
  m.intra = m.inter = {0, 1e30, 0, "t", 0, {}, {}, {}};
  auto head_dim_notes = [](const predict::Prediction& p) {
    int n = 0;
    for (const std::string& s : p.notes) n += s.find("head_dim") != std::string::npos ? 1 : 0;
    return n;
  };
  ASSERT_EQ(sc.shape.head_dim, 16);  // the table's head_dim
  const predict::Prediction own = predict::predict_step(sc, cp::find("zigzag"), m, sizeof(float));
  EXPECT_EQ(head_dim_notes(own), 0);
  sc.shape.head_dim = 64;
  const predict::Prediction other = predict::predict_step(sc, cp::find("zigzag"), m, sizeof(float));
  EXPECT_EQ(head_dim_notes(other), 2) << "one per pass";
  bool named = false;
  for (const std::string& s : other.notes)
    named = named || s.find("attention forward at head_dim 64 not in the table: the rates of head_dim 16") == 0;
  EXPECT_TRUE(named);
  // Rows of head_dim 64 (3x the time of 16's per tile and head): taken, no note.
  predict::Machine more = m;
  for (predict::AttnRate a : m.cal.attn) {
    a.head_dim = 64, a.full_s *= 3, a.partial_s *= 3, a.tile_s *= 3;
    more.cal.attn.push_back(a);
  }
  const predict::Prediction taken = predict::predict_step(sc, cp::find("zigzag"), more, sizeof(float));
  EXPECT_EQ(head_dim_notes(taken), 0);
  EXPECT_LT(taken.attn_compute_s, other.attn_compute_s);  // 3x, where the scaled rows said 4x
}

}  // namespace
