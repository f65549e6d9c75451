// SwiGLU gate: y = silu(a) * b elementwise, silu(a) = a * sigmoid(a), with its backward.
// Elementwise over whole contiguous views: one flat index into the raw arrays (a (row, col)
// index would cost a 64-bit division per element, slower than the element's arithmetic),
// sigmoid through exp_fast (fp32: the branch-free exp, so the loop vectorises).
#pragma once
#include "kernels/types.hpp"

namespace minicp::kernels {

// a[S,F], b[S,F] -> y[S,F]; all three contiguous.
template <class T>
void swiglu_fwd(CView2<T> a, CView2<T> b, View2<T> y);

// dy[S,F] -> da[S,F], db[S,F] (overwritten); all contiguous. d silu/da = sig * (1 + a (1 - sig)).
template <class T>
void swiglu_bwd(CView2<T> a, CView2<T> b, CView2<T> dy, View2<T> da, View2<T> db);

}  // namespace minicp::kernels
