// SwiGLU gate: y = silu(a) * b elementwise, silu(a) = a * sigmoid(a), with its backward.
#pragma once
#include <stdexcept>

#include "kernels/types.hpp"

namespace minicp::kernels {

// a[S,F], b[S,F] -> y[S,F].
template <class T>
void swiglu_fwd(CView2<T> a, CView2<T> b, View2<T> y) {
  const int S = static_cast<int>(a.extent(0)), F = static_cast<int>(a.extent(1));
  if (b.extent(0) != a.extent(0) || b.extent(1) != a.extent(1) || y.extent(0) != a.extent(0) ||
      y.extent(1) != a.extent(1))
    throw std::invalid_argument("swiglu_fwd: a, b, y must all be [S,F]");
  Kokkos::parallel_for(
      "kernels::swiglu::fwd", Kokkos::RangePolicy<Exec, Kokkos::IndexType<int64_t>>(0, int64_t(S) * F), KOKKOS_LAMBDA(const int64_t idx) {
        const int s = int(idx / F), f = int(idx % F);
        const T av = a(s, f);
        const T sig = T(1) / (T(1) + exp(-av));
        y(s, f) = av * sig * b(s, f);
      });
}

// dy[S,F] -> da[S,F], db[S,F] (overwritten). d silu/da = sig * (1 + a (1 - sig)).
template <class T>
void swiglu_bwd(CView2<T> a, CView2<T> b, CView2<T> dy, View2<T> da, View2<T> db) {
  const int S = static_cast<int>(a.extent(0)), F = static_cast<int>(a.extent(1));
  if (b.extent(0) != a.extent(0) || dy.extent(0) != a.extent(0) || da.extent(0) != a.extent(0) ||
      db.extent(0) != a.extent(0) || b.extent(1) != a.extent(1) || dy.extent(1) != a.extent(1) ||
      da.extent(1) != a.extent(1) || db.extent(1) != a.extent(1))
    throw std::invalid_argument("swiglu_bwd: a, b, dy, da, db must all be [S,F]");
  Kokkos::parallel_for(
      "kernels::swiglu::bwd", Kokkos::RangePolicy<Exec, Kokkos::IndexType<int64_t>>(0, int64_t(S) * F), KOKKOS_LAMBDA(const int64_t idx) {
        const int s = int(idx / F), f = int(idx % F);
        const T av = a(s, f), g = dy(s, f);
        const T sig = T(1) / (T(1) + exp(-av));
        da(s, f) = g * b(s, f) * sig * (T(1) + av * (T(1) - sig));
        db(s, f) = g * av * sig;
      });
}

}  // namespace minicp::kernels
