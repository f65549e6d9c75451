// Portable attention: one Kokkos thread per (query row, head) for the forward and dQ, one
// per (key row, kv head) for dK/dV, scalar loops, no scratch or atomics. Runs on any
// execution space; it is the device fallback and a second implementation for the tests.
#include <stdexcept>

#include "kernels/attention_impl.hpp"

namespace minicp::kernels::detail {

constexpr int kMaxHeadDim = 256;

namespace {
void check_dim(int D) {
  if (D > kMaxHeadDim)
    throw std::invalid_argument("attention (portable): head_dim " + std::to_string(D) + " exceeds " +
                                std::to_string(kMaxHeadDim));
}

// Executed = useful here: count visible (query, key) pairs over all heads.
double count_visible(const AttnMask& mask, int Sq, int Sk) {
  double n = 0;
  Kokkos::parallel_reduce(
      "kernels::attention::count_visible", Kokkos::RangePolicy<Exec>(0, Sq),
      KOKKOS_LAMBDA(const int i, double& acc) {
        for (int j = 0; j < Sk; ++j) acc += mask.visible(i, j) ? 1.0 : 0.0;
      },
      n);
  return n;
}
}  // namespace

template <class T>
AttnStats attention_fwd_portable(CView3<T> q, CView3<T> k, CView3<T> v, const AttnMask& mask, View3<T> o, View2<T> lse,
                                 T scale) {
  const int Sq = int(q.extent(0)), H = int(q.extent(1)), D = int(q.extent(2)), Sk = int(k.extent(0));
  const int group = H / int(k.extent(1));
  check_dim(D);
  Kokkos::parallel_for(
      "kernels::attention::fwd_portable", Kokkos::RangePolicy<Exec>(0, Sq * H), KOKKOS_LAMBDA(const int idx) {
        const int i = idx / H, h = idx % H, g = h / group;
        T acc[kMaxHeadDim];
        for (int d = 0; d < D; ++d) acc[d] = 0;
        T m = neg_inf<T>(), l = 0;
        for (int j = 0; j < Sk; ++j) {
          if (!mask.visible(i, j)) continue;
          T s = 0;
          for (int d = 0; d < D; ++d) s += q(i, h, d) * k(j, g, d);
          s *= scale;
          if (s > m) {  // rescale the running sum to the new maximum
            const T c = exp(m - s);
            l *= c;
            for (int d = 0; d < D; ++d) acc[d] *= c;
            m = s;
          }
          const T p = exp(s - m);
          l += p;
          for (int d = 0; d < D; ++d) acc[d] += p * v(j, g, d);
        }
        const T inv = l > T(0) ? T(1) / l : T(0);
        for (int d = 0; d < D; ++d) o(i, h, d) = acc[d] * inv;
        lse(i, h) = l > T(0) ? m + log(l) : neg_inf<T>();
      });
  AttnStats st;
  st.flops = 4.0 * D * H * count_visible(mask, Sq, Sk);
  return st;
}

template <class T>
AttnStats attention_bwd_portable(CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<T> lse, CView3<T> dout,
                                 const AttnMask& mask, View3<T> dq, View3<T> dk, View3<T> dv, T scale) {
  const int Sq = int(q.extent(0)), H = int(q.extent(1)), D = int(q.extent(2)), Sk = int(k.extent(0));
  const int Hkv = int(k.extent(1)), group = H / Hkv;
  check_dim(D);
  View2<T> delta = attention_delta<T>(o, dout);
  // dQ: rows of queries.
  Kokkos::parallel_for(
      "kernels::attention::bwd_dq_portable", Kokkos::RangePolicy<Exec>(0, Sq * H), KOKKOS_LAMBDA(const int idx) {
        const int i = idx / H, h = idx % H, g = h / group;
        const T L = lse(i, h);
        if (L == neg_inf<T>()) return;
        for (int j = 0; j < Sk; ++j) {
          if (!mask.visible(i, j)) continue;
          T s = 0, dp = 0;
          for (int d = 0; d < D; ++d) {
            s += q(i, h, d) * k(j, g, d);
            dp += dout(i, h, d) * v(j, g, d);
          }
          const T p = exp(s * scale - L);
          const T ds = p * (dp - delta(i, h)) * scale;
          for (int d = 0; d < D; ++d) dq(i, h, d) += ds * k(j, g, d);
        }
      });
  // dK, dV: rows of keys, summed over the query heads of the kv group.
  Kokkos::parallel_for(
      "kernels::attention::bwd_dkdv_portable", Kokkos::RangePolicy<Exec>(0, Sk * Hkv), KOKKOS_LAMBDA(const int idx) {
        const int j = idx / Hkv, g = idx % Hkv;
        for (int h = g * group; h < (g + 1) * group; ++h) {
          for (int i = 0; i < Sq; ++i) {
            const T L = lse(i, h);
            if (L == neg_inf<T>() || !mask.visible(i, j)) continue;
            T s = 0, dp = 0;
            for (int d = 0; d < D; ++d) {
              s += q(i, h, d) * k(j, g, d);
              dp += dout(i, h, d) * v(j, g, d);
            }
            const T p = exp(s * scale - L);
            const T ds = p * (dp - delta(i, h)) * scale;
            for (int d = 0; d < D; ++d) {
              dv(j, g, d) += p * dout(i, h, d);
              dk(j, g, d) += ds * q(i, h, d);
            }
          }
        }
      });
  AttnStats st;
  st.flops = 10.0 * D * H * count_visible(mask, Sq, Sk);
  return st;
}

#define MINICP_ATTN_PORTABLE_INST(T)                                                                                 \
  template AttnStats attention_fwd_portable<T>(CView3<T>, CView3<T>, CView3<T>, const AttnMask&, View3<T>, View2<T>, \
                                               T);                                                                   \
  template AttnStats attention_bwd_portable<T>(CView3<T>, CView3<T>, CView3<T>, CView3<T>, CView2<T>, CView3<T>,     \
                                               const AttnMask&, View3<T>, View3<T>, View3<T>, T);
MINICP_ATTN_PORTABLE_INST(float)
MINICP_ATTN_PORTABLE_INST(double)
#undef MINICP_ATTN_PORTABLE_INST

}  // namespace minicp::kernels::detail
