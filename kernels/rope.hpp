// Rotary position embedding, rotate-half convention, at GLOBAL token positions given per
// row, so every CP layout rotates a token the same way. Angles are formed in fp64 so that
// long-context positions (1e6+) keep full precision whatever T is.
#pragma once
#include "kernels/types.hpp"

namespace minicp::kernels {

// x[S,H,D] rotated in place; pos[S] global positions; inverse=true applies R^T (backward:
// dx = R^T dy, since R is orthogonal).
// y[i]       = x[i] cos(p f_i) - x[i+D/2] sin(p f_i)
// y[i+D/2]   = x[i+D/2] cos(p f_i) + x[i] sin(p f_i),   f_i = theta^(-2i/D), i < D/2.
template <class T>
void rope_apply(View3<T> x, Kokkos::View<const int64_t*, Mem> pos, double theta, bool inverse = false);

}  // namespace minicp::kernels
