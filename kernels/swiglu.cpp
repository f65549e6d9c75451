// Definitions and the fp32 / fp64 / bf16 instantiations of kernels/swiglu.hpp (compiled with the
// kernels' flags, so the loops vectorise for the build host).
#include "kernels/swiglu.hpp"

#include <stdexcept>
#include "kernels/fast_exp.hpp"

namespace minicp::kernels {

template <class T>
void swiglu_fwd(CView2<T> a, CView2<T> b, View2<T> y) {
  using A = acc_t<T>;
  const int S = static_cast<int>(a.extent(0)), F = static_cast<int>(a.extent(1));
  if (b.extent(0) != a.extent(0) || b.extent(1) != a.extent(1) || y.extent(0) != a.extent(0) ||
      y.extent(1) != a.extent(1))
    throw std::invalid_argument("swiglu_fwd: a, b, y must all be [S,F]");
  if (!a.span_is_contiguous() || !b.span_is_contiguous() || !y.span_is_contiguous())
    throw std::invalid_argument("swiglu_fwd: a, b, y must be contiguous");
  const T *ap = a.data(), *bp = b.data();
  T *yp = y.data();
  for_each_index(
      "kernels::swiglu::fwd", int64_t(S) * F, KOKKOS_LAMBDA(const int64_t i) {
        const A av = A(ap[i]);
        const A sig = A(1) / (A(1) + exp_fast(-av));
        yp[i] = T(av * sig * A(bp[i]));
      });
}

template <class T>
void swiglu_bwd(CView2<T> a, CView2<T> b, CView2<T> dy, View2<T> da, View2<T> db) {
  using A = acc_t<T>;
  const int S = static_cast<int>(a.extent(0)), F = static_cast<int>(a.extent(1));
  if (b.extent(0) != a.extent(0) || dy.extent(0) != a.extent(0) || da.extent(0) != a.extent(0) ||
      db.extent(0) != a.extent(0) || b.extent(1) != a.extent(1) || dy.extent(1) != a.extent(1) ||
      da.extent(1) != a.extent(1) || db.extent(1) != a.extent(1))
    throw std::invalid_argument("swiglu_bwd: a, b, dy, da, db must all be [S,F]");
  if (!a.span_is_contiguous() || !b.span_is_contiguous() || !dy.span_is_contiguous() || !da.span_is_contiguous() ||
      !db.span_is_contiguous())
    throw std::invalid_argument("swiglu_bwd: a, b, dy, da, db must be contiguous");
  const T *ap = a.data(), *bp = b.data(), *gp = dy.data();
  T *dap = da.data(), *dbp = db.data();
  for_each_index(
      "kernels::swiglu::bwd", int64_t(S) * F, KOKKOS_LAMBDA(const int64_t i) {
        const A av = A(ap[i]), g = A(gp[i]);
        const A sig = A(1) / (A(1) + exp_fast(-av));
        dap[i] = T(g * A(bp[i]) * sig * (A(1) + av * (A(1) - sig)));
        dbp[i] = T(g * av * sig);
      });
}

#define MINICP_SWIGLU_INST(T)                                  \
  template void swiglu_fwd<T>(CView2<T>, CView2<T>, View2<T>); \
  template void swiglu_bwd<T>(CView2<T>, CView2<T>, CView2<T>, View2<T>, View2<T>);
MINICP_SWIGLU_INST(float)
MINICP_SWIGLU_INST(double)
MINICP_SWIGLU_INST(bf16)
#undef MINICP_SWIGLU_INST

}  // namespace minicp::kernels
