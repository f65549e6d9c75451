// Tiled host attention, fp32 and fp64: the loops of attention_tiled.hpp with tile products
// on tile::gemm (register blocks, no operand packing beyond one contiguous copy of each B
// panel), a vectorised online softmax, and tiles the mask hides completely skipped
// (positions are compared per tile: min/max of each tile). The helpers the bf16 path
// shares are defined here.
#include "kernels/attention_tiled.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/fast_exp.hpp"
#include "kernels/tile_gemm.hpp"

namespace minicp::kernels::detail::tiled {

std::vector<TileInfo> tile_info(Kokkos::View<const int64_t*, Mem> pos, Kokkos::View<const int32_t*, Mem> doc, int n,
                                int tile) {
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

// The mask tests run down the contiguous direction of the tile (keys of a [q, k] tile, queries
// of a transposed one) on the position and document arrays, so they vectorise; an
// element-wise AttnMask::visible() here cost as much as the tile's products at 1024 rows.
template <class T>
void apply_mask(const AttnMask& m, T* s, int qs, int ks, int i0, int mq, int j0, int mk) {
  const int64_t *qp = m.q_pos.data() + i0, *kp = m.k_pos.data() + j0;
  const bool docs = m.has_docs();
  const int32_t *qd = docs ? m.q_doc.data() + i0 : nullptr, *kd = docs ? m.k_doc.data() + j0 : nullptr;
  const bool causal = m.causal || m.window > 0;
  const int64_t W = m.window;
  const T hidden = neg_inf<T>();
  // One line of the tile: n entries of stride 1 against the fixed position p (document d) of
  // the other side; keys_vary says whether the line's entries are keys (p is the query) or queries.
  const auto line = [&](T* x, int n, const int64_t* pos, const int32_t* doc, int64_t p, int32_t d, bool keys_vary) {
    if (keys_vary) {
#pragma omp simd
      for (int e = 0; e < n; ++e) {
        const bool hide = (causal && pos[e] > p) || (W > 0 && pos[e] <= p - W) || (docs && doc[e] != d);
        x[e] = hide ? hidden : x[e];
      }
    } else {
#pragma omp simd
      for (int e = 0; e < n; ++e) {
        const bool hide = (causal && p > pos[e]) || (W > 0 && p <= pos[e] - W) || (docs && d != doc[e]);
        x[e] = hide ? hidden : x[e];
      }
    }
  };
  if (ks == 1) {
    for (int i = 0; i < mq; ++i) line(s + size_t(i) * qs, mk, kp, kd, qp[i], docs ? qd[i] : 0, true);
  } else {
    for (int j = 0; j < mk; ++j) line(s + size_t(j) * ks, mq, qp, qd, kp[j], docs ? kd[j] : 0, false);
  }
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

template <class T>
void rescale_rows(T* acc, int D, int mq, const T* corr) {
  for (int i = 0; i < mq; ++i) {
    if (corr[i] == T(1)) continue;
    T* arow = acc + size_t(i) * D;
#pragma omp simd
    for (int d = 0; d < D; ++d) arow[d] *= corr[i];
  }
}

template <class T>
void finish_rows(const T* acc, int D, int mq, const T* m, const T* l, T* o, int ldo, T* lse, int ldl) {
  for (int r = 0; r < mq; ++r) {
    T* orow = o + size_t(r) * ldo;
    const T l_r = l[r];
    const T inv = l_r > T(0) ? T(1) / l_r : T(0);
    for (int d = 0; d < D; ++d) orow[d] = acc[size_t(r) * D + d] * inv;
    lse[size_t(r) * ldl] = l_r > T(0) ? m[r] + std::log(l_r) : neg_inf<T>();
  }
}

template <class T>
void exp_rows(T* P, int ld, int mq, int mk, const T* lse, int ldl) {
  for (int r = 0; r < mq; ++r) {
    T* prow = P + size_t(r) * ld;
    const T L = lse[size_t(r) * ldl];
    if (L == neg_inf<T>()) {
      for (int c = 0; c < mk; ++c) prow[c] = T(0);
      continue;
    }
    exp_shift(prow, mk, L);
  }
}

template <class T>
void ds_rows(const T* P, T* dP, int ld, int mq, int mk, const T* delta, int ldl, T scale) {
  for (int r = 0; r < mq; ++r) {
    const T dl = delta[size_t(r) * ldl];
    const T* prow = P + size_t(r) * ld;
    T* dsrow = dP + size_t(r) * ld;
#pragma omp simd
    for (int c = 0; c < mk; ++c) dsrow[c] = scale * prow[c] * (dsrow[c] - dl);
  }
}

template <class T>
void add_parts(T* dq, const T* parts, int nparts, size_t n) {
  Kokkos::parallel_for("kernels::attention::bwd_dq_reduce",
                       Kokkos::RangePolicy<HostExec, Kokkos::IndexType<int64_t>>(0, int64_t(n)), [&](const int64_t e) {
                         T acc = 0;
                         for (int s = 0; s < nparts; ++s) acc += parts[size_t(s) * n + e];
                         dq[e] += acc;
                       });
  Kokkos::fence();
}

namespace {

// The fp32/fp64 engine: tile::gemm products in T. The softmax scale is folded into the
// packed copies of q (forward) and K (backward), as the products are in T anyway.
template <class T>
struct TileEngine {
  using In = T;
  using Acc = T;
  static constexpr const char* kName = "";
  static int padded(int n) { return tile::padded<T>(n); }

  class Fwd {
   public:
    Fwd(int D, int bq, int /*bk*/) : D_(D), qT_(tile::packed_size<T>(D, bq)) {}
    // qT [D, ld] packed: scale * q of this tile, transposed
    void load_q(const T* Qt, int ldq, int mq, T scale) { tile::pack_transposed(D_, mq, Qt, ldq, qT_.data(), scale); }
    void scores(const T* Kt, int ldk, int mk, int nq, T* sT, int ld) {
      tile::gemm_packed<T>(mk, nq, D_, Kt, ldk, 1, qT_.data(), sT, ld, false);
    }
    void add_pv(const T* sT, int ld, int mk, int mq, const T* Vt, int ldk, T* acc) {
      tile::gemm<T>(mq, D_, mk, sT, 1, ld, Vt, ldk, acc, D_, true);
    }

   private:
    int D_;
    std::vector<T> qT_;
  };

  // The k-tile packed three ways, each reused by every (head, q-tile) of the item.
  class Bwd {
   public:
    Bwd(int D, int /*bq*/, int bk)
        : D_(D), kT_(tile::packed_size<T>(D, bk)), vT_(tile::packed_size<T>(D, bk)), kp_(tile::packed_size<T>(bk, D)) {}
    void load_k(const T* Kt, const T* Vt, int ldk, int mk, T scale) {
      tile::pack_transposed(D_, mk, Kt, ldk, kT_.data(), scale);  // [D, ld]: scale * K_t^T
      tile::pack_transposed(D_, mk, Vt, ldk, vT_.data());         // [D, ld]: V_t^T
      tile::pack(mk, D_, Kt, ldk, kp_.data());                    // [bk, D]: K_t
    }
    void scores(const T* Qt, int ldq, int mq, int nk, T* P, int ld) {
      tile::gemm_packed<T>(mq, nk, D_, Qt, ldq, 1, kT_.data(), P, ld, false);
    }
    void add_dv_and_dp(const T* P, int ld, int mq, int mk, int nk, const T* dOt, int ldq, T* dVt, int ldk, T* dP) {
      tile::gemm<T>(mk, D_, mq, P, 1, ld, dOt, ldq, dVt, ldk, true);
      tile::gemm_packed<T>(mq, nk, D_, dOt, ldq, 1, vT_.data(), dP, ld, false);
    }
    void add_dk_and_dq(const T* dS, int ld, int mq, int mk, const T* Qt, int ldq, T* dKt, int ldk, T* dQt) {
      tile::gemm<T>(mk, D_, mq, dS, 1, ld, Qt, ldq, dKt, ldk, true);
      tile::gemm_packed<T>(mq, D_, mk, dS, ld, 1, kp_.data(), dQt, ldq, true);
    }

   private:
    int D_;
    std::vector<T> kT_, vT_, kp_;
  };
};

}  // namespace

#define MINICP_ATTN_TILED_HELPERS(T)                                                      \
  template void apply_mask<T>(const AttnMask&, T*, int, int, int, int, int, int);         \
  template void online_softmax_columns<T>(T*, int, int, int, T*, T*, T*, T*);             \
  template void rescale_rows<T>(T*, int, int, const T*);                                  \
  template void finish_rows<T>(const T*, int, int, const T*, const T*, T*, int, T*, int); \
  template void exp_rows<T>(T*, int, int, int, const T*, int);                            \
  template void ds_rows<T>(const T*, T*, int, int, int, const T*, int, T);                \
  template void add_parts<T>(T*, const T*, int, size_t);
MINICP_ATTN_TILED_HELPERS(float)
MINICP_ATTN_TILED_HELPERS(double)
#undef MINICP_ATTN_TILED_HELPERS

}  // namespace minicp::kernels::detail::tiled

namespace minicp::kernels::detail {

template <class T>
AttnStats attention_fwd_tiled(CView3<T> q, CView3<T> k, CView3<T> v, const AttnMask& mask, View3<acc_t<T>> o,
                              View2<acc_t<T>> lse, acc_t<T> scale, int tile_q, int tile_k) {
  return tiled::fwd<tiled::TileEngine<T>>(q, k, v, mask, o, lse, scale, tile_q, tile_k);
}

template <class T>
AttnStats attention_bwd_tiled(CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<acc_t<T>> lse, CView3<T> dout,
                              const AttnMask& mask, View3<acc_t<T>> dq, View3<acc_t<T>> dk, View3<acc_t<T>> dv,
                              acc_t<T> scale, int tile_q, int tile_k) {
  return tiled::bwd<tiled::TileEngine<T>>(q, k, v, o, lse, dout, mask, dq, dk, dv, scale, tile_q, tile_k);
}

#define MINICP_ATTN_TILED_INST(T)                                                                                    \
  template AttnStats attention_fwd_tiled<T>(CView3<T>, CView3<T>, CView3<T>, const AttnMask&, View3<T>, View2<T>, T, \
                                            int, int);                                                               \
  template AttnStats attention_bwd_tiled<T>(CView3<T>, CView3<T>, CView3<T>, CView3<T>, CView2<T>, CView3<T>,        \
                                            const AttnMask&, View3<T>, View3<T>, View3<T>, T, int, int);
MINICP_ATTN_TILED_INST(float)
MINICP_ATTN_TILED_INST(double)
#undef MINICP_ATTN_TILED_INST

}  // namespace minicp::kernels::detail

namespace minicp::kernels {
AttnTiles attention_default_tiles(bool backward) {
  using namespace detail::tiled;
  return backward ? AttnTiles{kBwdTileQ, kBwdTileK} : AttnTiles{kFwdTileQ, kFwdTileK};
}

std::string attention_tiles() {
  using namespace detail::tiled;
  return "forward " + std::to_string(kFwdTileQ) + "x" + std::to_string(kFwdTileK) + ", backward " +
         std::to_string(kBwdTileQ) + "x" + std::to_string(kBwdTileK) + " (q x k tokens)";
}
}  // namespace minicp::kernels
