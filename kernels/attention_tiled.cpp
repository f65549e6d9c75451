// Tiled host attention: each (head, q-tile) work item walks the k-tiles; S = Q K^T and the
// P V / gradient products are BLAS calls on tiles (gemm_host, single-threaded inside the
// parallel region), the online softmax is a vectorised loop, and tiles that the mask hides
// completely are skipped (positions are compared per tile: min/max of each tile).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention_impl.hpp"
#include "kernels/fast_exp.hpp"
#include "kernels/gemm.hpp"

namespace minicp::kernels::detail {
namespace {

constexpr int kDefaultTileQ = 128;
constexpr int kDefaultTileK = 128;

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

template <class T>
void apply_mask(const AttnMask& m, T* s, int lds, int i0, int mq, int j0, int mk) {
  for (int r = 0; r < mq; ++r)
    for (int c = 0; c < mk; ++c)
      if (!m.visible(i0 + r, j0 + c)) s[r * lds + c] = neg_inf<T>();
}

int pick(int requested, int fallback) { return requested > 0 ? requested : fallback; }

}  // namespace

template <class T>
AttnStats attention_fwd_tiled(CView3<T> q, CView3<T> k, CView3<T> v, const AttnMask& mask, View3<T> o, View2<T> lse,
                              T scale, int tile_q, int tile_k) {
  const int Sq = int(q.extent(0)), H = int(q.extent(1)), D = int(q.extent(2)), Sk = int(k.extent(0));
  const int Hkv = int(k.extent(1)), group = H / Hkv;
  const int bq = pick(tile_q, kDefaultTileQ), bk = pick(tile_k, kDefaultTileK);
  const int nqt = (Sq + bq - 1) / bq, nkt = (Sk + bk - 1) / bk;
  const auto qi = tile_info(mask.q_pos, mask.q_doc, Sq, bq);
  const auto ki = tile_info(mask.k_pos, mask.k_doc, Sk, bk);
  const int ldq = H * D, ldk = Hkv * D;
  const T *Q = q.data(), *K = k.data(), *V = v.data();
  T *O = o.data(), *LSE = lse.data();
  std::vector<AttnStats> stats(size_t(nqt) * H);

  // Items in decreasing q-tile order: under a causal mask the heaviest rows go first.
  Kokkos::parallel_for(
      "kernels::attention::fwd_tiled",
      Kokkos::RangePolicy<HostExec, Kokkos::Schedule<Kokkos::Dynamic>>(0, nqt * H), [&](const int item) {
        const int h = item % H, qt = nqt - 1 - item / H, g = h / group;
        const int i0 = qt * bq, mq = std::min(bq, Sq - i0);
        std::vector<T> sbuf(size_t(bq) * bk), acc(size_t(bq) * D, T(0)), mrow(bq, neg_inf<T>()), lrow(bq, T(0));
        AttnStats& st = stats[item];
        const T* Qt = Q + size_t(i0) * ldq + size_t(h) * D;
        for (int kt = 0; kt < nkt; ++kt) {
          const Block b = classify(mask, qi[qt], ki[kt]);
          if (b == Block::Skip) {
            ++st.blocks_skipped;
            continue;
          }
          const int j0 = kt * bk, mk = std::min(bk, Sk - j0);
          const T* Kt = K + size_t(j0) * ldk + size_t(g) * D;
          const T* Vt = V + size_t(j0) * ldk + size_t(g) * D;
          T* S = sbuf.data();
          gemm_host<T>(Trans::N, Trans::T, mq, mk, D, scale, Qt, ldq, Kt, ldk, T(0), S, bk);
          if (b == Block::Partial) apply_mask(mask, S, bk, i0, mq, j0, mk);
          for (int r = 0; r < mq; ++r) {
            T* srow = S + size_t(r) * bk;
            T mx = neg_inf<T>();
#pragma omp simd reduction(max : mx)
            for (int c = 0; c < mk; ++c) mx = srow[c] > mx ? srow[c] : mx;
            const T mnew = std::max(mrow[r], mx);
            if (mnew == neg_inf<T>()) {  // nothing visible in this row yet
              for (int c = 0; c < mk; ++c) srow[c] = T(0);
              continue;
            }
            const T sum = exp_shift_sum(srow, mk, mnew);
            const T corr = exp_fast(mrow[r] - mnew);
            if (corr != T(1)) {
              T* arow = acc.data() + size_t(r) * D;
#pragma omp simd
              for (int d = 0; d < D; ++d) arow[d] *= corr;
            }
            lrow[r] = lrow[r] * corr + sum;
            mrow[r] = mnew;
          }
          gemm_host<T>(Trans::N, Trans::N, mq, D, mk, T(1), S, bk, Vt, ldk, T(1), acc.data(), D);
          ++st.blocks_computed;
          st.flops += 4.0 * mq * mk * D;
        }
        for (int r = 0; r < mq; ++r) {
          T* orow = O + size_t(i0 + r) * ldq + size_t(h) * D;
          const T l = lrow[r];
          const T inv = l > T(0) ? T(1) / l : T(0);
          for (int d = 0; d < D; ++d) orow[d] = acc[size_t(r) * D + d] * inv;
          LSE[size_t(i0 + r) * H + h] = l > T(0) ? mrow[r] + std::log(l) : neg_inf<T>();
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
  const int bq = pick(tile_q, kDefaultTileQ), bk = pick(tile_k, kDefaultTileK);
  const int nqt = (Sq + bq - 1) / bq, nkt = (Sk + bk - 1) / bk;
  const auto qi = tile_info(mask.q_pos, mask.q_doc, Sq, bq);
  const auto ki = tile_info(mask.k_pos, mask.k_doc, Sk, bk);
  const int ldq = H * D, ldk = Hkv * D;
  View2<T> delta = attention_delta<T>(o, dout);
  Kokkos::fence();

  // Work item = (kv head, split of the k-tiles): it owns its dK, dV rows outright. With
  // few kv heads the k-tiles are split further and each split >0 sums its dQ into its own
  // buffer, added to dq at the end; with enough kv heads dq is written directly.
  const int conc = int(HostExec().concurrency());
  const int nsplit = std::max(1, std::min(nkt, (2 * conc + Hkv - 1) / Hkv));
  std::vector<T> dq_parts(size_t(nsplit - 1) * Sq * H * D, T(0));
  const T *Q = q.data(), *K = k.data(), *V = v.data(), *dO = dout.data(), *LSE = lse.data(), *Dl = delta.data();
  T *dQ = dq.data(), *dK = dk.data(), *dV = dv.data();
  std::vector<AttnStats> stats(size_t(nsplit) * Hkv);

  Kokkos::parallel_for(
      "kernels::attention::bwd_tiled",
      Kokkos::RangePolicy<HostExec, Kokkos::Schedule<Kokkos::Dynamic>>(0, nsplit * Hkv), [&](const int item) {
        const int g = item % Hkv, split = item / Hkv;
        T* dQdst = split == 0 ? dQ : dq_parts.data() + size_t(split - 1) * Sq * H * D;
        std::vector<T> pbuf(size_t(bq) * bk), dpbuf(size_t(bq) * bk);
        AttnStats& st = stats[item];
        for (int kt = split; kt < nkt; kt += nsplit) {
          const int j0 = kt * bk, mk = std::min(bk, Sk - j0);
          const T* Kt = K + size_t(j0) * ldk + size_t(g) * D;
          const T* Vt = V + size_t(j0) * ldk + size_t(g) * D;
          T* dKt = dK + size_t(j0) * ldk + size_t(g) * D;
          T* dVt = dV + size_t(j0) * ldk + size_t(g) * D;
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
              gemm_host<T>(Trans::N, Trans::T, mq, mk, D, scale, Q + qoff, ldq, Kt, ldk, T(0), P, bk);
              if (b == Block::Partial) apply_mask(mask, P, bk, i0, mq, j0, mk);
              for (int r = 0; r < mq; ++r) {
                T* prow = P + size_t(r) * bk;
                const T L = LSE[size_t(i0 + r) * H + h];
                if (L == neg_inf<T>()) {
                  for (int c = 0; c < mk; ++c) prow[c] = T(0);
                  continue;
                }
                exp_shift(prow, mk, L);
              }
              // dV += P^T dO ; dP = dO V^T
              gemm_host<T>(Trans::T, Trans::N, mk, D, mq, T(1), P, bk, dO + qoff, ldq, T(1), dVt, ldk);
              gemm_host<T>(Trans::N, Trans::T, mq, mk, D, T(1), dO + qoff, ldq, Vt, ldk, T(0), dP, bk);
              for (int r = 0; r < mq; ++r) {  // dS = P * (dP - Delta), in place of dP
                const T dl = Dl[size_t(i0 + r) * H + h];
                T *prow = P + size_t(r) * bk, *dsrow = dP + size_t(r) * bk;
#pragma omp simd
                for (int c = 0; c < mk; ++c) dsrow[c] = prow[c] * (dsrow[c] - dl);
              }
              // dK += scale dS^T Q ; dQ += scale dS K
              gemm_host<T>(Trans::T, Trans::N, mk, D, mq, scale, dP, bk, Q + qoff, ldq, T(1), dKt, ldk);
              gemm_host<T>(Trans::N, Trans::N, mq, D, mk, scale, dP, bk, Kt, ldk, T(1), dQdst + qoff, ldq);
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
