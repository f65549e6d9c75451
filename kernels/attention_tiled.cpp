// Tiled host attention. Tile products go through tile::gemm (register blocks, no operand
// packing beyond one contiguous copy of each B panel), the online softmax is vectorised, and
// tiles that the mask hides completely are skipped (positions are compared per tile: min/max
// of each tile).
//
// Layouts are chosen so that no product needs a transposed copy of a strided operand:
//  - forward, work item (head, q-tile): the q tile is transposed once per item (qT [D, bq],
//    scale folded in) and scores are kept transposed, sT [bk, bq] = K_t qT. The online
//    softmax then runs down the columns, one query per lane, without horizontal reductions.
//  - backward, work item (kv head, k-tiles of a split): K_t and V_t are transposed once per
//    k-tile (kT, vT [D, bk]) and reused by every (head, q-tile) of the item; scores are kept
//    as P [bq, bk] = q kT.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/attention_impl.hpp"
#include "kernels/fast_exp.hpp"
#include "kernels/tile_gemm.hpp"

namespace minicp::kernels::detail {
namespace {

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

std::vector<TileInfo> tile_info(Kokkos::View<const int64_t*, Mem> pos, Kokkos::View<const int32_t*, Mem> doc,
                                int n, int tile) {
  std::vector<TileInfo> out((n + tile - 1) / tile);
  const bool docs = doc.extent(0) != 0;
  for (size_t t = 0; t < out.size(); ++t) {
    TileInfo ti{INT64_MAX, INT64_MIN, INT32_MAX, INT32_MIN};
    for (int i = int(t) * tile; i < std::min(n, int(t + 1) * tile); ++i) {
      ti.pmin = std::min(ti.pmin, pos(i));
      ti.pmax = std::max(ti.pmax, pos(i));
      ti.dmin = std::min(ti.dmin, docs ? doc(i) : 0);
      ti.dmax = std::max(ti.dmax, docs ? doc(i) : 0);
    }
    out[t] = ti;
  }
  return out;
}

Block classify(const AttnMask& m, const TileInfo& q, const TileInfo& k) {
  const bool causal = m.causal || m.window > 0;
  const int64_t W = m.window;
  if (causal && k.pmin > q.pmax) return Block::Skip;
  if (W > 0 && k.pmax <= q.pmin - W) return Block::Skip;
  if (k.dmax < q.dmin || k.dmin > q.dmax) return Block::Skip;
  const bool full = (!causal || k.pmax <= q.pmin) && (W == 0 || k.pmin > q.pmax - W) &&
                    (q.dmin == q.dmax && k.dmin == k.dmax && q.dmin == k.dmin);
  return full ? Block::Full : Block::Partial;
}

// Masked scores of a partial tile to -inf: query i0+i against key j0+j sits at
// s[i * qs + j * ks] (qs = ld, ks = 1 for a [q, k] tile; the reverse for a transposed one).
template <class T>
void apply_mask(const AttnMask& m, T* s, int qs, int ks, int i0, int mq, int j0, int mk) {
  for (int i = 0; i < mq; ++i)
    for (int j = 0; j < mk; ++j)
      if (!m.visible(i0 + i, j0 + j)) s[size_t(i) * qs + size_t(j) * ks] = neg_inf<T>();
}

// One online-softmax step for the n queries (columns) of a transposed score tile sT
// [rows, ld]: the running max m and sum l are updated, corr is the factor the running output
// must be multiplied by, and sT becomes exp(sT - m_new). A column that has seen no visible
// key keeps m = -inf, l = 0 and gets probabilities 0 (shift 0 instead of -inf, so no NaN).
template <class T>
void online_softmax_columns(T* sT, int ld, int n, int rows, T* m, T* l, T* shift, T* corr) {
#pragma omp simd
  for (int i = 0; i < n; ++i) shift[i] = m[i];
  for (int j = 0; j < rows; ++j) {
    const T* srow = sT + size_t(j) * ld;
#pragma omp simd
    for (int i = 0; i < n; ++i) shift[i] = srow[i] > shift[i] ? srow[i] : shift[i];
  }
  for (int i = 0; i < n; ++i) {
    const T m_new = shift[i];
    shift[i] = m_new == neg_inf<T>() ? T(0) : m_new;
    corr[i] = exp_fast(m[i] - shift[i]);
    l[i] *= corr[i];
    m[i] = m_new;
  }
  for (int j = 0; j < rows; ++j) exp_sub_accumulate(sT + size_t(j) * ld, shift, l, n);
}

int pick(int requested, int fallback) { return requested > 0 ? requested : fallback; }

}  // namespace

template <class T>
AttnStats attention_fwd_tiled(CView3<T> q, CView3<T> k, CView3<T> v, const AttnMask& mask, View3<T> o, View2<T> lse,
                              T scale, int tile_q, int tile_k) {
  const int Sq = int(q.extent(0)), H = int(q.extent(1)), D = int(q.extent(2)), Sk = int(k.extent(0));
  const int Hkv = int(k.extent(1)), group = H / Hkv;
  const int bq = pick(tile_q, kFwdTileQ), bk = pick(tile_k, kFwdTileK);
  const int nqt = (Sq + bq - 1) / bq, nkt = (Sk + bk - 1) / bk;
  const auto qi = tile_info(mask.q_pos, mask.q_doc, Sq, bq);
  const auto ki = tile_info(mask.k_pos, mask.k_doc, Sk, bk);
  const int ldq = H * D, ldk = Hkv * D;
  const T *Q = q.data(), *K = k.data(), *V = v.data();
  T *O = o.data(), *LSE = lse.data();
  std::vector<AttnStats> stats(size_t(nqt) * H);

  // Items in decreasing q-tile order: under a causal mask the heaviest rows go first.
  const int bqp = tile::padded<T>(bq);  // transposed tiles: bq columns padded to whole panels
  Kokkos::parallel_for(
      "kernels::attention::fwd_tiled",
      Kokkos::RangePolicy<HostExec, Kokkos::Schedule<Kokkos::Dynamic>>(0, nqt * H), [&](const int item) {
        const int h = item % H, qt = nqt - 1 - item / H, g = h / group;
        const int i0 = qt * bq, mq = std::min(bq, Sq - i0);
        std::vector<T> qT(tile::packed_size<T>(D, bq));  // [D, bqp] packed: scale * q of this tile, transposed
        std::vector<T> sT(size_t(bk) * bqp);       // [bk, bqp]: scores, then probabilities
        std::vector<T> acc(size_t(bq) * D, T(0));  // [bq, D]: unnormalised output
        std::vector<T> m(bqp, neg_inf<T>()), l(bqp, T(0)), shift(bqp), corr(bqp);  // per query
        AttnStats& st = stats[item];
        const T* Qt = Q + size_t(i0) * ldq + size_t(h) * D;
        tile::pack_transposed(D, mq, Qt, ldq, qT.data(), scale);
        const int nq = tile::padded<T>(mq);  // columns of sT in use
        for (int kt = 0; kt < nkt; ++kt) {
          const Block b = classify(mask, qi[qt], ki[kt]);
          if (b == Block::Skip) {
            ++st.blocks_skipped;
            continue;
          }
          const int j0 = kt * bk, mk = std::min(bk, Sk - j0);
          const T* Kt = K + size_t(j0) * ldk + size_t(g) * D;
          const T* Vt = V + size_t(j0) * ldk + size_t(g) * D;
          tile::gemm_packed<T>(mk, nq, D, Kt, ldk, 1, qT.data(), sT.data(), bqp, false);
          if (b == Block::Partial) apply_mask(mask, sT.data(), 1, bqp, i0, mq, j0, mk);
          online_softmax_columns(sT.data(), bqp, nq, mk, m.data(), l.data(), shift.data(), corr.data());
          for (int i = 0; i < mq; ++i) {
            if (corr[i] == T(1)) continue;
            T* arow = acc.data() + size_t(i) * D;
#pragma omp simd
            for (int d = 0; d < D; ++d) arow[d] *= corr[i];
          }
          // acc[i, :] += sum_j sT[j, i] v_j
          tile::gemm<T>(mq, D, mk, sT.data(), 1, bqp, Vt, ldk, acc.data(), D, true);
          ++st.blocks_computed;
          st.flops += 4.0 * mq * mk * D;
        }
        for (int r = 0; r < mq; ++r) {
          T* orow = O + size_t(i0 + r) * ldq + size_t(h) * D;
          const T l_r = l[r];
          const T inv = l_r > T(0) ? T(1) / l_r : T(0);
          for (int d = 0; d < D; ++d) orow[d] = acc[size_t(r) * D + d] * inv;
          LSE[size_t(i0 + r) * H + h] = l_r > T(0) ? m[r] + std::log(l_r) : neg_inf<T>();
        }
      });
  Kokkos::fence();
  AttnStats total;
  for (const auto& s : stats) total += s;
  return total;
}

template <class T>
AttnStats attention_bwd_tiled(CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<T> lse, CView3<T> dout,
                              const AttnMask& mask, View3<T> dq, View3<T> dk, View3<T> dv, T scale, int tile_q,
                              int tile_k) {
  const int Sq = int(q.extent(0)), H = int(q.extent(1)), D = int(q.extent(2)), Sk = int(k.extent(0));
  const int Hkv = int(k.extent(1)), group = H / Hkv;
  const int bq = pick(tile_q, kBwdTileQ), bk = pick(tile_k, kBwdTileK);
  const int nqt = (Sq + bq - 1) / bq, nkt = (Sk + bk - 1) / bk;
  const auto qi = tile_info(mask.q_pos, mask.q_doc, Sq, bq);
  const auto ki = tile_info(mask.k_pos, mask.k_doc, Sk, bk);
  const int ldq = H * D, ldk = Hkv * D;
  View2<T> delta = attention_delta<T>(o, dout);
  Kokkos::fence();

  // Work item = (kv head, split of the k-tiles): it owns its dK, dV rows outright. With
  // few kv heads the k-tiles are split further and each split >0 sums its dQ into its own
  // buffer, added to dq at the end; with enough kv heads dq is written directly. Splits:
  // the fewest that make the item count a multiple of the thread count (items of one
  // split cost the same), so 2 kv heads on 2 threads need no dQ buffer and no reduction.
  const int conc = int(HostExec().concurrency());
  const int nsplit = std::max(1, std::min(nkt, conc / std::gcd(conc, Hkv)));
  std::vector<T> dq_parts(size_t(nsplit - 1) * Sq * H * D, T(0));
  const T *Q = q.data(), *K = k.data(), *V = v.data(), *dO = dout.data(), *LSE = lse.data(), *Dl = delta.data();
  T *dQ = dq.data(), *dK = dk.data(), *dV = dv.data();
  std::vector<AttnStats> stats(size_t(nsplit) * Hkv);
  const int bkp = tile::padded<T>(bk);  // score tiles: bk columns padded to whole panels

  Kokkos::parallel_for(
      "kernels::attention::bwd_tiled",
      Kokkos::RangePolicy<HostExec, Kokkos::Schedule<Kokkos::Dynamic>>(0, nsplit * Hkv), [&](const int item) {
        const int g = item % Hkv, split = item / Hkv;
        T* dQdst = split == 0 ? dQ : dq_parts.data() + size_t(split - 1) * Sq * H * D;
        // The k-tile packed three ways, each reused by every (head, q-tile) of the item:
        std::vector<T> kT(tile::packed_size<T>(D, bk));  // [D, bkp]: scale * K_t^T
        std::vector<T> vT(tile::packed_size<T>(D, bk));  // [D, bkp]: V_t^T
        std::vector<T> kp(tile::packed_size<T>(bk, D));  // [bk, D]: K_t
        std::vector<T> pbuf(size_t(bq) * bkp), dpbuf(size_t(bq) * bkp);  // [bq, bkp]: P, then dP and dS
        AttnStats& st = stats[item];
        for (int kt = split; kt < nkt; kt += nsplit) {
          const int j0 = kt * bk, mk = std::min(bk, Sk - j0);
          const T* Kt = K + size_t(j0) * ldk + size_t(g) * D;
          const T* Vt = V + size_t(j0) * ldk + size_t(g) * D;
          T* dKt = dK + size_t(j0) * ldk + size_t(g) * D;
          T* dVt = dV + size_t(j0) * ldk + size_t(g) * D;
          tile::pack_transposed(D, mk, Kt, ldk, kT.data(), scale);
          tile::pack_transposed(D, mk, Vt, ldk, vT.data());
          tile::pack(mk, D, Kt, ldk, kp.data());
          const int nk = tile::padded<T>(mk);  // columns of P, dP computed
          for (int h = g * group; h < (g + 1) * group; ++h) {
            for (int qt = 0; qt < nqt; ++qt) {
              const Block b = classify(mask, qi[qt], ki[kt]);
              if (b == Block::Skip) {
                ++st.blocks_skipped;
                continue;
              }
              const int i0 = qt * bq, mq = std::min(bq, Sq - i0);
              const size_t qoff = size_t(i0) * ldq + size_t(h) * D;
              T *P = pbuf.data(), *dP = dpbuf.data();
              // Only the first mk columns of P and dP are read below; the padding is not.
              tile::gemm_packed<T>(mq, nk, D, Q + qoff, ldq, 1, kT.data(), P, bkp, false);
              if (b == Block::Partial) apply_mask(mask, P, bkp, 1, i0, mq, j0, mk);
              for (int r = 0; r < mq; ++r) {
                T* prow = P + size_t(r) * bkp;
                const T L = LSE[size_t(i0 + r) * H + h];
                if (L == neg_inf<T>()) {
                  for (int c = 0; c < mk; ++c) prow[c] = T(0);
                  continue;
                }
                exp_shift(prow, mk, L);
              }
              // dV_t += P^T dO ; dP = dO V_t^T
              tile::gemm<T>(mk, D, mq, P, 1, bkp, dO + qoff, ldq, dVt, ldk, true);
              tile::gemm_packed<T>(mq, nk, D, dO + qoff, ldq, 1, vT.data(), dP, bkp, false);
              for (int r = 0; r < mq; ++r) {  // dS = scale * P * (dP - Delta), in place of dP
                const T dl = Dl[size_t(i0 + r) * H + h];
                T *prow = P + size_t(r) * bkp, *dsrow = dP + size_t(r) * bkp;
#pragma omp simd
                for (int c = 0; c < mk; ++c) dsrow[c] = scale * prow[c] * (dsrow[c] - dl);
              }
              // dK_t += dS^T q ; dq += dS K_t
              tile::gemm<T>(mk, D, mq, dP, 1, bkp, Q + qoff, ldq, dKt, ldk, true);
              tile::gemm_packed<T>(mq, D, mk, dP, bkp, 1, kp.data(), dQdst + qoff, ldq, true);
              ++st.blocks_computed;
              st.flops += 10.0 * mq * mk * D;
            }
          }
        }
      });
  Kokkos::fence();
  if (nsplit > 1) {
    const size_t n = size_t(Sq) * H * D;
    const T* parts = dq_parts.data();
    Kokkos::parallel_for(
        "kernels::attention::bwd_dq_reduce", Kokkos::RangePolicy<HostExec, Kokkos::IndexType<int64_t>>(0, int64_t(n)), [&](const int64_t e) {
          T acc = 0;
          for (int s = 0; s < nsplit - 1; ++s) acc += parts[size_t(s) * n + e];
          dQ[e] += acc;
        });
    Kokkos::fence();
  }
  AttnStats total;
  for (const auto& s : stats) total += s;
  return total;
}

#define MINICP_ATTN_TILED_INST(T)                                                                                \
  template AttnStats attention_fwd_tiled<T>(CView3<T>, CView3<T>, CView3<T>, const AttnMask&, View3<T>,        \
                                            View2<T>, T, int, int);                                            \
  template AttnStats attention_bwd_tiled<T>(CView3<T>, CView3<T>, CView3<T>, CView3<T>, CView2<T>, CView3<T>,  \
                                            const AttnMask&, View3<T>, View3<T>, View3<T>, T, int, int);
MINICP_ATTN_TILED_INST(float)
MINICP_ATTN_TILED_INST(double)
#undef MINICP_ATTN_TILED_INST

}  // namespace minicp::kernels::detail

namespace minicp::kernels {
AttnTiles attention_default_tiles(bool backward) {
  return backward ? AttnTiles{detail::kBwdTileQ, detail::kBwdTileK} : AttnTiles{detail::kFwdTileQ, detail::kFwdTileK};
}

std::string attention_tiles() {
  return "forward " + std::to_string(detail::kFwdTileQ) + "x" + std::to_string(detail::kFwdTileK) + ", backward " +
         std::to_string(detail::kBwdTileQ) + "x" + std::to_string(detail::kBwdTileK) + " (q x k tokens)";
}
}  // namespace minicp::kernels
