// Internal: the two attention implementations behind kernels::attention_fwd/bwd.
#pragma once
#include "kernels/attention.hpp"

namespace minicp::kernels::detail {

template <class T>
AttnStats attention_fwd_portable(CView3<T> q, CView3<T> k, CView3<T> v, const AttnMask& mask, View3<T> o,
                                 View2<T> lse, T scale);
template <class T>
AttnStats attention_bwd_portable(CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<T> lse, CView3<T> dout,
                                 const AttnMask& mask, View3<T> dq, View3<T> dk, View3<T> dv, T scale);
template <class T>
AttnStats attention_fwd_tiled(CView3<T> q, CView3<T> k, CView3<T> v, const AttnMask& mask, View3<T> o, View2<T> lse,
                              T scale, int tile_q, int tile_k);
template <class T>
AttnStats attention_bwd_tiled(CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<T> lse, CView3<T> dout,
                              const AttnMask& mask, View3<T> dq, View3<T> dk, View3<T> dv, T scale, int tile_q,
                              int tile_k);

// Delta[i,h] = sum_d dout[i,h,d] * o[i,h,d] (the softmax-backward row term).
template <class T>
View2<T> attention_delta(CView3<T> o, CView3<T> dout);

}  // namespace minicp::kernels::detail
