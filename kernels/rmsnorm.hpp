// RMSNorm over the hidden dimension: y = x / sqrt(mean(x^2) + eps) * w, with its backward.
// The forward keeps rstd per token so the backward needs no second reduction over x.
#pragma once
#include "kernels/types.hpp"

namespace minicp::kernels {

// x[S,N], w[N] -> y[S,N], rstd[S]. rstd and dw are in the accumulator type (fp32 for bf16).
template <class T>
void rmsnorm_fwd(CView2<T> x, CView1<T> w, Scalar<acc_t<T>> eps, View2<T> y, View1<acc_t<T>> rstd);

// x[S,N], w[N], rstd[S], dy[S,N] -> dx[S,N] (overwritten), dw[N] (accumulated).
template <class T>
void rmsnorm_bwd(CView2<T> x, CView1<T> w, CView1<acc_t<T>> rstd, CView2<T> dy, View2<T> dx, View1<acc_t<T>> dw);

}  // namespace minicp::kernels
