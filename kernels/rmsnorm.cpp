// Definitions and the fp32 / fp64 instantiations of kernels/rmsnorm.hpp (compiled with the
// kernels' flags, so the loops vectorise for the build host).
#include "kernels/rmsnorm.hpp"

#include <stdexcept>

namespace minicp::kernels {

template <class T>
void rmsnorm_fwd(CView2<T> x, CView1<T> w, Scalar<T> eps, View2<T> y, View1<T> rstd) {
  const int S = static_cast<int>(x.extent(0)), N = static_cast<int>(x.extent(1));
  if (w.extent(0) != x.extent(1) || y.extent(0) != x.extent(0) || y.extent(1) != x.extent(1) ||
      rstd.extent(0) != x.extent(0))
    throw std::invalid_argument("rmsnorm_fwd: shapes must be x[S,N], w[N], y[S,N], rstd[S]");
  Kokkos::parallel_for(
      "kernels::rmsnorm::fwd", Kokkos::RangePolicy<Exec>(0, S), KOKKOS_LAMBDA(const int s) {
        T ss = 0;
        for (int n = 0; n < N; ++n) ss += x(s, n) * x(s, n);
        const T r = T(1) / sqrt(ss / T(N) + eps);
        rstd(s) = r;
        for (int n = 0; n < N; ++n) y(s, n) = x(s, n) * r * w(n);
      });
}

template <class T>
void rmsnorm_bwd(CView2<T> x, CView1<T> w, CView1<T> rstd, CView2<T> dy, View2<T> dx, View1<T> dw) {
  const int S = static_cast<int>(x.extent(0)), N = static_cast<int>(x.extent(1));
  if (dy.extent(0) != x.extent(0) || dy.extent(1) != x.extent(1) || dx.extent(0) != x.extent(0) ||
      dx.extent(1) != x.extent(1) || dw.extent(0) != x.extent(1) || w.extent(0) != x.extent(1) ||
      rstd.extent(0) != x.extent(0))
    throw std::invalid_argument("rmsnorm_bwd: shapes must be x,dy,dx[S,N], w,dw[N], rstd[S]");
  Kokkos::parallel_for(
      "kernels::rmsnorm::bwd_x", Kokkos::RangePolicy<Exec>(0, S), KOKKOS_LAMBDA(const int s) {
        const T r = rstd(s);
        T dot = 0;  // sum_n (dy*w) * xhat
        for (int n = 0; n < N; ++n) dot += dy(s, n) * w(n) * x(s, n) * r;
        dot /= T(N);
        for (int n = 0; n < N; ++n) dx(s, n) = r * (dy(s, n) * w(n) - x(s, n) * r * dot);
      });
  // dw: one work item per block of kCols columns walks all rows, reading each row's block
  // contiguously (a column-at-a-time walk strides through memory and was ~10x slower).
  constexpr int kCols = 64;
  Kokkos::parallel_for(
      "kernels::rmsnorm::bwd_w", Kokkos::RangePolicy<Exec>(0, (N + kCols - 1) / kCols), KOKKOS_LAMBDA(const int blk) {
        const int n0 = blk * kCols, n1 = n0 + kCols < N ? n0 + kCols : N;
        T acc[kCols] = {};
        for (int s = 0; s < S; ++s) {
          const T r = rstd(s);
          for (int n = n0; n < n1; ++n) acc[n - n0] += dy(s, n) * x(s, n) * r;
        }
        for (int n = n0; n < n1; ++n) dw(n) += acc[n - n0];
      });
}


#define MINICP_RMSNORM_INST(T)                                                   \
  template void rmsnorm_fwd<T>(CView2<T>, CView1<T>, T, View2<T>, View1<T>); \
  template void rmsnorm_bwd<T>(CView2<T>, CView1<T>, CView1<T>, CView2<T>, View2<T>, View1<T>);
MINICP_RMSNORM_INST(float)
MINICP_RMSNORM_INST(double)
#undef MINICP_RMSNORM_INST

}  // namespace minicp::kernels
