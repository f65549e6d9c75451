// Definitions and the fp32 / fp64 / bf16 instantiations of kernels/rmsnorm.hpp (compiled with the
// kernels' flags, so the loops vectorise for the build host).
#include "kernels/rmsnorm.hpp"

#include <stdexcept>

namespace minicp::kernels {

template <class T>
void rmsnorm_fwd(CView2<T> x, CView1<T> w, Scalar<acc_t<T>> eps, View2<T> y, View1<acc_t<T>> rstd) {
  using A = acc_t<T>;
  const int S = static_cast<int>(x.extent(0)), N = static_cast<int>(x.extent(1));
  if (w.extent(0) != x.extent(1) || y.extent(0) != x.extent(0) || y.extent(1) != x.extent(1) ||
      rstd.extent(0) != x.extent(0))
    throw std::invalid_argument("rmsnorm_fwd: shapes must be x[S,N], w[N], y[S,N], rstd[S]");
  Kokkos::parallel_for(
      "kernels::rmsnorm::fwd", Kokkos::RangePolicy<Exec>(0, S), KOKKOS_LAMBDA(const int s) {
        A ss = 0;
        for (int n = 0; n < N; ++n) ss += A(x(s, n)) * A(x(s, n));
        const A r = A(1) / sqrt(ss / A(N) + eps);
        rstd(s) = r;
        for (int n = 0; n < N; ++n) y(s, n) = T(A(x(s, n)) * r * A(w(n)));
      });
}

template <class T>
void rmsnorm_bwd(CView2<T> x, CView1<T> w, CView1<acc_t<T>> rstd, CView2<T> dy, View2<T> dx, View1<acc_t<T>> dw) {
  using A = acc_t<T>;
  const int S = static_cast<int>(x.extent(0)), N = static_cast<int>(x.extent(1));
  if (dy.extent(0) != x.extent(0) || dy.extent(1) != x.extent(1) || dx.extent(0) != x.extent(0) ||
      dx.extent(1) != x.extent(1) || dw.extent(0) != x.extent(1) || w.extent(0) != x.extent(1) ||
      rstd.extent(0) != x.extent(0))
    throw std::invalid_argument("rmsnorm_bwd: shapes must be x,dy,dx[S,N], w,dw[N], rstd[S]");
  Kokkos::parallel_for(
      "kernels::rmsnorm::bwd_x", Kokkos::RangePolicy<Exec>(0, S), KOKKOS_LAMBDA(const int s) {
        const A r = rstd(s);
        A dot = 0;  // sum_n (dy*w) * xhat
        for (int n = 0; n < N; ++n) dot += A(dy(s, n)) * A(w(n)) * A(x(s, n)) * r;
        dot /= A(N);
        for (int n = 0; n < N; ++n) dx(s, n) = T(r * (A(dy(s, n)) * A(w(n)) - A(x(s, n)) * r * dot));
      });
  // dw: one work item per block of kCols columns walks all rows, reading each row's block
  // contiguously (a column-at-a-time walk strides through memory and was ~10x slower).
  constexpr int kCols = 64;
  Kokkos::parallel_for(
      "kernels::rmsnorm::bwd_w", Kokkos::RangePolicy<Exec>(0, (N + kCols - 1) / kCols), KOKKOS_LAMBDA(const int blk) {
        const int n0 = blk * kCols, n1 = n0 + kCols < N ? n0 + kCols : N;
        A acc[kCols] = {};
        for (int s = 0; s < S; ++s) {
          const A r = rstd(s);
          for (int n = n0; n < n1; ++n) acc[n - n0] += A(dy(s, n)) * A(x(s, n)) * r;
        }
        for (int n = n0; n < n1; ++n) dw(n) += acc[n - n0];
      });
}

#define MINICP_RMSNORM_INST(T, A)                                            \
  template void rmsnorm_fwd<T>(CView2<T>, CView1<T>, A, View2<T>, View1<A>); \
  template void rmsnorm_bwd<T>(CView2<T>, CView1<T>, CView1<A>, CView2<T>, View2<T>, View1<A>);
MINICP_RMSNORM_INST(float, float)
MINICP_RMSNORM_INST(double, double)
MINICP_RMSNORM_INST(bf16, float)
#undef MINICP_RMSNORM_INST

}  // namespace minicp::kernels
