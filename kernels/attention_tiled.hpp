// Internal: the tiled attention loops, templated on the engine that computes the tile
// products, so the fp32/fp64 path (attention_tiled.cpp: tile_gemm.hpp) and the bf16 path
// (attention_bf16.cpp: AVX512-BF16 dot products) share one tiling, one mask classification
// and one online softmax. The helpers below are defined once, in attention_tiled.cpp.
//
// Layouts are chosen so that no product needs a transposed copy of a strided operand:
//  - forward, work item (head, q-tile): scores are kept transposed, sT [bk, bq] (key rows,
//    query columns), so the online softmax runs down the columns, one query per lane, without
//    horizontal reductions.
//  - backward, work item (kv head, k-tiles of a split): each k-tile is prepared once
//    (Bwd::load_k) and reused by every (head, q-tile) of the item; scores are kept as
//    P [bq, bk].
//
// An engine E has In (stored type), Acc (accumulator type), kName (Kokkos label suffix),
// padded(n) (the columns a score tile is computed to) and two per-item workspaces:
//   E::Fwd(D, bq, bk): load_q(Qt, ldq, mq, scale) once per item, then per k-tile
//     scores(Kt, ldk, mk, nq, sT, ld)              sT[j, i] = scale q_i . k_j
//     add_pv(sT, ld, mk, mq, Vt, ldk, acc)         acc[i, :] += sum_j sT[j, i] v_j
//   E::Bwd(D, bq, bk): load_k(Kt, Vt, ldk, mk, scale) once per k-tile, then per q-tile
//     scores(Qt, ldq, mq, nk, P, ld)               P[i, j] = scale q_i . k_j
//     add_dv_and_dp(P, ld, mq, mk, nk, dOt, ldq, dVt, ldk, dP)   dV += P^T dO; dP = dO V^T
//     add_dk_and_dq(dS, ld, mq, mk, Qt, ldq, dKt, ldk, dQt)      dK += dS^T q; dQ += dS K
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/attention_impl.hpp"

namespace minicp::kernels::detail::tiled {

// Default tiles (S=4096, D=128 sweep, BM_Attention*Tiles): the forward streams K and V once
// per q-tile, so a taller q-tile halves that traffic (+10% over 128 x 128); the backward
// holds four [bq, bk] tiles per item and is best at 128 x 128.
constexpr int kFwdTileQ = 256, kFwdTileK = 128;
constexpr int kBwdTileQ = 128, kBwdTileK = 128;

struct TileInfo {
  int64_t pmin, pmax;  // min / max global position in the tile
  int32_t dmin, dmax;  // min / max document id in the tile
};

enum class Block { Skip, Full, Partial };

std::vector<TileInfo> tile_info(Kokkos::View<const int64_t*, Mem> pos, Kokkos::View<const int32_t*, Mem> doc, int n,
                                int tile);
Block classify(const AttnMask& m, const TileInfo& q, const TileInfo& k);

// Masked scores of a partial tile to -inf: query i0+i against key j0+j sits at
// s[i * qs + j * ks] (qs = ld, ks = 1 for a [q, k] tile; the reverse for a transposed one).
template <class T>
void apply_mask(const AttnMask& m, T* s, int qs, int ks, int i0, int mq, int j0, int mk);
// One online-softmax step down the n columns of a transposed score tile (see the definition).
template <class T>
void online_softmax_columns(T* sT, int ld, int n, int rows, T* m, T* l, T* shift, T* corr);
// acc[i, :] *= corr[i] for the mq rows of a [mq, D] accumulator.
template <class T>
void rescale_rows(T* acc, int D, int mq, const T* corr);
// o[r, :] = acc[r, :] / l[r], lse[r] = m[r] + log l[r] (rows of stride ldo and ldl); 0 and -inf for empty rows.
template <class T>
void finish_rows(const T* acc, int D, int mq, const T* m, const T* l, T* o, int ldo, T* lse, int ldl);
// P[r, :mk] <- exp(P[r, :mk] - lse[r]) (lse of stride ldl); rows with lse = -inf become 0.
template <class T>
void exp_rows(T* P, int ld, int mq, int mk, const T* lse, int ldl);
// dP[r, :mk] <- scale * P[r, :mk] * (dP[r, :mk] - delta[r]): dS, in place of dP.
template <class T>
void ds_rows(const T* P, T* dP, int ld, int mq, int mk, const T* delta, int ldl, T scale);
// dq[e] += sum_s parts[s * n + e] for the nparts partial dQ buffers of n entries.
template <class T>
void add_parts(T* dq, const T* parts, int nparts, size_t n);

inline int pick(int requested, int fallback) { return requested > 0 ? requested : fallback; }

// One call's shapes, tiles and raw pointers; q/o [Sq, H, D], k/v [Sk, Hkv, D], lse [Sq, H].
template <class In, class Acc>
struct Plan {
  const AttnMask* mask;
  int Sq, Sk, H, Hkv, D, group, ldq, ldk, bq, bk, nqt, nkt;
  std::vector<TileInfo> qi, ki;
  Acc scale;
  const In *Q, *K, *V;
};

template <class In, class Acc>
Plan<In, Acc> make_plan(CView3<In> q, CView3<In> k, CView3<In> v, const AttnMask& mask, Acc scale, int bq, int bk) {
  Plan<In, Acc> p;
  p.mask = &mask;
  p.Sq = int(q.extent(0)), p.H = int(q.extent(1)), p.D = int(q.extent(2));
  p.Sk = int(k.extent(0)), p.Hkv = int(k.extent(1)), p.group = p.H / p.Hkv;
  p.ldq = p.H * p.D, p.ldk = p.Hkv * p.D;
  p.bq = bq, p.bk = bk;
  p.nqt = (p.Sq + bq - 1) / bq, p.nkt = (p.Sk + bk - 1) / bk;
  p.qi = tile_info(mask.q_pos, mask.q_doc, p.Sq, bq);
  p.ki = tile_info(mask.k_pos, mask.k_doc, p.Sk, bk);
  p.scale = scale;
  p.Q = q.data(), p.K = k.data(), p.V = v.data();
  return p;
}

inline AttnStats sum_stats(const std::vector<AttnStats>& stats) {
  AttnStats total;
  for (const auto& s : stats) total += s;
  return total;
}

// A work item's buffer of n values of T, zeroed, cache-line aligned, kept by its thread from
// item to item (Slot tells a thread's buffers apart). A fresh vector per item of 128 KiB
// comes from mmap, or from a heap top glibc trims again, and its page faults cost a fifth of
// the AMX engine's work between its tile products (S = 4096, D = 128); kept, the bf16
// forward runs 6-24% faster (median 12%, 8 alternated pairs on Zen 5), the others as before.
template <class T, int Slot>
T* item_buffer(size_t n) {
  constexpr size_t kAlign = 64 / sizeof(T);  // a cache line
  thread_local std::vector<T> v;
  if (v.size() < n + kAlign) v.resize(n + kAlign);
  T* p = v.data() + (kAlign - (reinterpret_cast<uintptr_t>(v.data()) / sizeof(T)) % kAlign) % kAlign;
  std::fill_n(p, n, T(0));
  return p;
}

// Forward work item (head, q-tile): walks the k-tiles with an online softmax.
template <class E, class P>
void fwd_item(const P& p, int item, typename E::Acc* O, typename E::Acc* LSE, AttnStats& st) {
  using A = typename E::Acc;
  const int h = item % p.H, qt = p.nqt - 1 - item / p.H, g = h / p.group;
  const int i0 = qt * p.bq, mq = std::min(p.bq, p.Sq - i0);
  const int ld = E::padded(p.bq), nq = E::padded(mq);  // columns of sT: allocated, in use
  typename E::Fwd eng(p.D, p.bq, p.bk);
  A* const sT = item_buffer<A, 0>(size_t(p.bk) * ld);                    // [bk, ld]: scores
  A* const acc = item_buffer<A, 1>(size_t(p.bq) * p.D);                  // [bq, D]: unnormalised output
  std::vector<A> m(ld, neg_inf<A>()), l(ld, A(0)), shift(ld), corr(ld);  // per query
  const size_t qoff = size_t(i0) * p.ldq + size_t(h) * p.D;
  eng.load_q(p.Q + qoff, p.ldq, mq, p.scale);
  for (int kt = 0; kt < p.nkt; ++kt) {
    const Block b = classify(*p.mask, p.qi[qt], p.ki[kt]);
    if (b == Block::Skip) {
      ++st.blocks_skipped;
      continue;
    }
    const int j0 = kt * p.bk, mk = std::min(p.bk, p.Sk - j0);
    const size_t koff = size_t(j0) * p.ldk + size_t(g) * p.D;
    eng.scores(p.K + koff, p.ldk, mk, nq, sT, ld);
    if (b == Block::Partial) apply_mask(*p.mask, sT, 1, ld, i0, mq, j0, mk);
    online_softmax_columns(sT, ld, nq, mk, m.data(), l.data(), shift.data(), corr.data());
    rescale_rows(acc, p.D, mq, corr.data());
    eng.add_pv(sT, ld, mk, mq, p.V + koff, p.ldk, acc);
    ++st.blocks_computed;
    st.flops += 4.0 * mq * mk * p.D;
  }
  finish_rows(acc, p.D, mq, m.data(), l.data(), O + qoff, p.ldq, LSE + size_t(i0) * p.H + h, p.H);
}

template <class E>
AttnStats fwd(CView3<typename E::In> q, CView3<typename E::In> k, CView3<typename E::In> v, const AttnMask& mask,
              View3<typename E::Acc> o, View2<typename E::Acc> lse, typename E::Acc scale, int tile_q, int tile_k) {
  const auto p = make_plan<typename E::In, typename E::Acc>(q, k, v, mask, scale, pick(tile_q, kFwdTileQ),
                                                            pick(tile_k, kFwdTileK));
  std::vector<AttnStats> stats(size_t(p.nqt) * p.H);
  // Items in decreasing q-tile order: under a causal mask the heaviest rows go first.
  Kokkos::parallel_for(std::string("kernels::attention::fwd_tiled") + E::kName,
                       Kokkos::RangePolicy<HostExec, Kokkos::Schedule<Kokkos::Dynamic>>(0, p.nqt * p.H),
                       [&](const int item) { fwd_item<E>(p, item, o.data(), lse.data(), stats[item]); });
  Kokkos::fence();
  return sum_stats(stats);
}

// Where a backward call writes: dq (or the item's partial dQ buffer), dk, dv; delta [Sq, H].
template <class A>
struct BwdOut {
  const A *lse, *delta;
  A *dq, *dk, *dv;
};

// One (head, q-tile) block of a backward item against the k-tile the engine holds.
template <class E, class P>
void bwd_block(const P& p, typename E::Bwd& eng, const BwdOut<typename E::Acc>& out, int h, int qt, int kt,
               typename E::Acc* Pt, typename E::Acc* dP, AttnStats& st) {
  const Block b = classify(*p.mask, p.qi[qt], p.ki[kt]);
  if (b == Block::Skip) {
    ++st.blocks_skipped;
    return;
  }
  const int ld = E::padded(p.bk);
  const int i0 = qt * p.bq, mq = std::min(p.bq, p.Sq - i0), j0 = kt * p.bk, mk = std::min(p.bk, p.Sk - j0);
  const int nk = E::padded(mk);  // columns of P, dP computed; only the first mk are read
  const size_t qoff = size_t(i0) * p.ldq + size_t(h) * p.D, koff = size_t(j0) * p.ldk + size_t(h / p.group) * p.D;
  const size_t loff = size_t(i0) * p.H + h;
  eng.scores(p.Q + qoff, p.ldq, mq, nk, Pt, ld);
  if (b == Block::Partial) apply_mask(*p.mask, Pt, ld, 1, i0, mq, j0, mk);
  exp_rows(Pt, ld, mq, mk, out.lse + loff, p.H);
  eng.add_dv_and_dp(Pt, ld, mq, mk, nk, p.dO + qoff, p.ldq, out.dv + koff, p.ldk, dP);
  ds_rows(Pt, dP, ld, mq, mk, out.delta + loff, p.H, p.scale);
  eng.add_dk_and_dq(dP, ld, mq, mk, p.Q + qoff, p.ldq, out.dk + koff, p.ldk, out.dq + qoff);
  ++st.blocks_computed;
  st.flops += 10.0 * mq * mk * p.D;
}

// Backward work item (kv head g, the k-tiles split, split + nsplit, ...).
template <class E, class P>
void bwd_item(const P& p, int g, int split, int nsplit, const BwdOut<typename E::Acc>& out, AttnStats& st) {
  using A = typename E::Acc;
  const int ld = E::padded(p.bk);
  typename E::Bwd eng(p.D, p.bq, p.bk);
  std::vector<A> pbuf(size_t(p.bq) * ld), dpbuf(size_t(p.bq) * ld);  // [bq, ld]: P, then dP and dS
  for (int kt = split; kt < p.nkt; kt += nsplit) {
    const int j0 = kt * p.bk, mk = std::min(p.bk, p.Sk - j0);
    const size_t koff = size_t(j0) * p.ldk + size_t(g) * p.D;
    eng.load_k(p.K + koff, p.V + koff, p.ldk, mk, p.scale);
    for (int h = g * p.group; h < (g + 1) * p.group; ++h)
      for (int qt = 0; qt < p.nqt; ++qt) bwd_block<E>(p, eng, out, h, qt, kt, pbuf.data(), dpbuf.data(), st);
  }
}

// The backward plan: the forward's plus dout.
template <class In, class Acc>
struct BwdPlan : Plan<In, Acc> {
  const In* dO;
};

template <class E>
AttnStats bwd(CView3<typename E::In> q, CView3<typename E::In> k, CView3<typename E::In> v, CView3<typename E::In> o,
              CView2<typename E::Acc> lse, CView3<typename E::In> dout, const AttnMask& mask, View3<typename E::Acc> dq,
              View3<typename E::Acc> dk, View3<typename E::Acc> dv, typename E::Acc scale, int tile_q, int tile_k) {
  using A = typename E::Acc;
  BwdPlan<typename E::In, A> p{
      make_plan<typename E::In, A>(q, k, v, mask, scale, pick(tile_q, kBwdTileQ), pick(tile_k, kBwdTileK)),
      dout.data()};
  View2<A> delta = attention_delta<typename E::In>(o, dout);
  Kokkos::fence();
  // Work item = (kv head, split of the k-tiles): it owns its dK, dV rows outright. With
  // few kv heads the k-tiles are split further and each split >0 sums its dQ into its own
  // buffer, added to dq at the end; with enough kv heads dq is written directly. Splits:
  // the fewest that make the item count a multiple of the thread count (items of one
  // split cost the same), so 2 kv heads on 2 threads need no dQ buffer and no reduction.
  const int conc = int(HostExec().concurrency());
  const int nsplit = std::max(1, std::min(p.nkt, conc / std::gcd(conc, p.Hkv)));
  const size_t n = size_t(p.Sq) * p.H * p.D;
  std::vector<A> dq_parts(size_t(nsplit - 1) * n, A(0));
  std::vector<AttnStats> stats(size_t(nsplit) * p.Hkv);
  Kokkos::parallel_for(std::string("kernels::attention::bwd_tiled") + E::kName,
                       Kokkos::RangePolicy<HostExec, Kokkos::Schedule<Kokkos::Dynamic>>(0, nsplit * p.Hkv),
                       [&](const int item) {
                         const int g = item % p.Hkv, split = item / p.Hkv;
                         A* dq_dst = split == 0 ? dq.data() : dq_parts.data() + size_t(split - 1) * n;
                         const BwdOut<A> out{lse.data(), delta.data(), dq_dst, dk.data(), dv.data()};
                         bwd_item<E>(p, g, split, nsplit, out, stats[item]);
                       });
  Kokkos::fence();
  if (nsplit > 1) add_parts(dq.data(), dq_parts.data(), nsplit - 1, n);
  return sum_stats(stats);
}

}  // namespace minicp::kernels::detail::tiled
