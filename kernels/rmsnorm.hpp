// RMSNorm over the hidden dimension: y = x / sqrt(mean(x^2) + eps) * w, with its backward.
// The forward keeps rstd per token so the backward needs no second reduction over x.
#pragma once
#include "kernels/types.hpp"

namespace minicp::kernels {

// x[S,N], w[N] -> y[S,N], rstd[S].
template <class T>
void rmsnorm_fwd(CView2<T> x, CView1<T> w, Scalar<T> eps, View2<T> y, View1<T> rstd);

// x[S,N], w[N], rstd[S], dy[S,N] -> dx[S,N] (overwritten), dw[N] (accumulated).
template <class T>
void rmsnorm_bwd(CView2<T> x, CView1<T> w, CView1<T> rstd, CView2<T> dy, View2<T> dx, View1<T> dw);

}  // namespace minicp::kernels
