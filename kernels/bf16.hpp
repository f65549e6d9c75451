// bfloat16 storage: the top 16 bits of an fp32 (8 exponent bits, 7 mantissa bits), the
// type real mixed-precision training stores weights, activations and messages in. It is a
// storage type only: every kernel computes in acc_t<T> (fp32 for bf16) and rounds once, to
// nearest even, when it stores.
#pragma once
// The communicator (which sums bf16 buffers) is built without Kokkos: there its functions are
// plain inline ones.
#if __has_include(<Kokkos_Core.hpp>)
#include <Kokkos_Core.hpp>
#define MINICP_BF16_FN KOKKOS_INLINE_FUNCTION
#else
#define MINICP_BF16_FN inline
#endif
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace minicp::kernels {

struct bf16 {
  uint16_t bits;
  bf16() = default;
  MINICP_BF16_FN bf16(float f) : bits(round(f)) {}  // NOLINT: converts like a float would
  MINICP_BF16_FN operator float() const {
    const uint32_t u = uint32_t(bits) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
  }
  // Round to nearest even; a NaN stays a (quiet) NaN, an infinity stays infinite.
  MINICP_BF16_FN static uint16_t round(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return uint16_t((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
  }
  // An fp64 rounded once to nearest even. Through a float rounded to nearest, a value just
  // past a bf16 halfway point can land on it and round to even the wrong way; a float
  // rounded to odd (24 bits, far more than bf16's 8 + 2) keeps which side it was on.
  MINICP_BF16_FN static bf16 from_double(double d) {
    float f = float(d);
    if (double(f) != d && f == f) {
      uint32_t u;
      memcpy(&u, &f, sizeof u);
      if ((f < 0 ? -double(f) : double(f)) > (d < 0 ? -d : d)) u -= 1;  // rounded away from zero: truncate
      u |= 1u;
      memcpy(&f, &u, sizeof f);
    }
    return bf16(f);
  }
};
static_assert(sizeof(bf16) == 2 && std::is_trivially_copyable<bf16>::value, "bf16 is two bytes, copied as bits");

// The type a kernel computes and accumulates a T in: fp32 for bf16, T itself otherwise.
// LSEs, softmax statistics, online merges and gradient accumulators are held in it.
template <class T>
struct Accumulator {
  using type = T;
};
template <>
struct Accumulator<bf16> {
  using type = float;
};
template <class T>
using acc_t = typename Accumulator<T>::type;

// Bytes of the accumulator of a value of elem bytes (bf16: an fp32).
constexpr size_t acc_size(size_t elem) { return elem == sizeof(bf16) ? sizeof(float) : elem; }

// The name a results file and the command line give a value type.
template <class T>
constexpr const char* dtype_name() {
  return std::is_same<T, bf16>::value ? "bf16" : std::is_same<T, float>::value ? "f32" : "f64";
}

}  // namespace minicp::kernels
