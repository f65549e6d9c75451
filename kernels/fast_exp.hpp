// Branch-free exp for the softmax inner loops: the compiler vectorises loops over it,
// which std::exp does not allow. fp32: Cephes-style range reduction and degree-6
// polynomial (max rel. error ~2 ulp); returns exactly 0 below -87.3 and for -inf.
// fp64 keeps std::exp: the fp64 paths are the references and must stay exact.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace minicp::kernels {

inline float exp_fast(float x) {
  const float lo = -87.3f, hi = 88.3f;
  const float xc = x < lo ? lo : (x > hi ? hi : x);
  const float n = std::floor(xc * 1.44269504088896341f + 0.5f);
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float pow2n;
  std::memcpy(&pow2n, &bits, sizeof(float));
  return x < lo ? 0.0f : p * pow2n;
}

inline double exp_fast(double x) { return std::exp(x); }

}  // namespace minicp::kernels
