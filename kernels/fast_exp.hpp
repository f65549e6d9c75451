// Branch-free fp32 exp for the softmax loops, scalar and on 16 lanes (GCC/Clang vector
// extensions, so the loops vectorise whatever the autovectoriser decides): Cephes-style
// range reduction and degree-6 polynomial, max rel. error ~4e-7, exactly 0 below -87.3 and
// for -inf. fp64 keeps std::exp: the fp64 paths are the references and must stay exact.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <Kokkos_Macros.hpp>

namespace minicp::kernels {
namespace detail {
constexpr float kExpLo = -87.3f, kExpHi = 88.3f;
// exp(xc - n ln2) for |xc - n ln2| <= ln2/2, on a float (exp_reduced, callable from kernels)
// or on lanes of floats (exp_reduced_lanes, host code only: device code cannot hold GCC vector
// types, not even in an instantiation it never calls). One text, so both do the same
// operations in the same order.
#define MINICP_EXP_REDUCED(FN, NAME)               \
  template <class V>                               \
  FN V NAME(V xc, V n) {                           \
    V r = xc - n * 0.693359375f;                   \
    r = r + n * 2.12194440e-4f;                    \
    V p = r * 1.9875691500e-4f + 1.3981999507e-3f; \
    p = p * r + 8.3334519073e-3f;                  \
    p = p * r + 4.1665795894e-2f;                  \
    p = p * r + 1.6666665459e-1f;                  \
    p = p * r + 5.0000001201e-1f;                  \
    return p * r * r + r + 1.0f;                   \
  }
MINICP_EXP_REDUCED(KOKKOS_INLINE_FUNCTION, exp_reduced)
MINICP_EXP_REDUCED(inline, exp_reduced_lanes)
#undef MINICP_EXP_REDUCED
}  // namespace detail

// Callable from kernels (KOKKOS_INLINE_FUNCTION): the swiglu gate uses it.
KOKKOS_INLINE_FUNCTION float exp_fast(float x) {
  float xc = x > detail::kExpLo ? x : detail::kExpLo;
  xc = xc < detail::kExpHi ? xc : detail::kExpHi;
  const float t = xc * 1.44269504088896341f;
  // round(xc / ln2), written so that loops over exp_fast vectorise (GCC 12 does not with a
  // select here, nor with a float-to-int conversion that is not of a truncf result)
  const int32_t ni = static_cast<int32_t>(truncf(t + copysignf(0.5f, t)));
  const int32_t bits = (ni + 127) << 23;
  float pow2n;
  memcpy(&pow2n, &bits, sizeof(float));
  return x < detail::kExpLo ? 0.0f : detail::exp_reduced(xc, static_cast<float>(ni)) * pow2n;
}

KOKKOS_INLINE_FUNCTION double exp_fast(double x) { return exp(x); }

namespace simd {
// 16 fp32 lanes with GCC/Clang vector extensions: one zmm with AVX-512, two ymm with AVX2,
// four xmm otherwise. Used so the exp loops vectorise whatever the autovectoriser decides.
using f16 = float __attribute__((vector_size(64)));
using i16 = int32_t __attribute__((vector_size(64)));
constexpr int kLanes = 16;

inline f16 load(const float* p) {
  f16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store(float* p, f16 v) { std::memcpy(p, &v, sizeof(v)); }
inline f16 splat(float x) { return f16{} + x; }
inline f16 select(i16 mask, f16 a, f16 b) { return (f16)(((i16)a & mask) | ((i16)b & ~mask)); }

// exp_fast on 16 lanes: the same operations in the same order as the scalar version.
inline f16 exp_fast(f16 x) {
  const f16 lo = splat(detail::kExpLo), hi = splat(detail::kExpHi);
  f16 xc = select(x > lo, x, lo);
  xc = select(xc < hi, xc, hi);
  const f16 t = xc * 1.44269504088896341f;
  const i16 ni = __builtin_convertvector(t + select(t >= 0.0f, splat(0.5f), splat(-0.5f)), i16);
  const f16 res = detail::exp_reduced_lanes(xc, __builtin_convertvector(ni, f16)) * (f16)((ni + 127) << 23);
  return select(x < lo, splat(0.0f), res);
}
}  // namespace simd

// x[c] <- exp(x[c] - shift) for c < n; returns the sum of the new values.
inline float exp_shift_sum(float* x, int n, float shift) {
  simd::f16 acc{};
  int c = 0;
  for (; c + simd::kLanes <= n; c += simd::kLanes) {
    const simd::f16 p = simd::exp_fast(simd::load(x + c) - shift);
    simd::store(x + c, p);
    acc += p;
  }
  float sum = 0;
  for (int l = 0; l < simd::kLanes; ++l) sum += acc[l];
  for (; c < n; ++c) {
    x[c] = exp_fast(x[c] - shift);
    sum += x[c];
  }
  return sum;
}
inline double exp_shift_sum(double* x, int n, double shift) {
  double sum = 0;
  for (int c = 0; c < n; ++c) {
    x[c] = std::exp(x[c] - shift);
    sum += x[c];
  }
  return sum;
}

// Down the columns of a transposed score tile: x[c] <- exp(x[c] - shift[c]) and
// sum[c] += x[c], for c < n.
inline void exp_sub_accumulate(float* x, const float* shift, float* sum, int n) {
  int c = 0;
  for (; c + simd::kLanes <= n; c += simd::kLanes) {
    const simd::f16 p = simd::exp_fast(simd::load(x + c) - simd::load(shift + c));
    simd::store(x + c, p);
    simd::store(sum + c, simd::load(sum + c) + p);
  }
  for (; c < n; ++c) {
    x[c] = exp_fast(x[c] - shift[c]);
    sum[c] += x[c];
  }
}
inline void exp_sub_accumulate(double* x, const double* shift, double* sum, int n) {
  for (int c = 0; c < n; ++c) {
    x[c] = std::exp(x[c] - shift[c]);
    sum[c] += x[c];
  }
}

// x[c] <- exp(x[c] - shift) for c < n.
template <class T>
void exp_shift(T* x, int n, T shift) {
  exp_shift_sum(x, n, shift);
}

}  // namespace minicp::kernels
