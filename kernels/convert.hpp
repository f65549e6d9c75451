// Elementwise conversion between value types (fp64, fp32, bf16): the one place a tensor
// changes precision. To bf16 it rounds to nearest even, once (fp64 too: bf16::from_double).
#pragma once
#include <stdexcept>

#include "kernels/types.hpp"

namespace minicp::kernels {

// dst[i] = To(src[i]) over n values of two contiguous arrays (device pointers).
template <class To, class From>
void convert(To* dst, const From* src, int64_t n);

// The same over whole Views of one span; throws std::invalid_argument when the spans differ.
template <class To, class From, class VTo, class VFrom>
void convert_view(const VTo& dst, const VFrom& src) {
  if (dst.span() != src.span()) throw std::invalid_argument("convert: the two views hold different numbers of values");
  convert<To, From>(dst.data(), src.data(), int64_t(src.span()));
}

// An accumulator-type tensor x as the stored type T holds it: x itself when T is its own
// accumulator, else x rounded into a new View (a forward's output as its backward reads it).
template <class T>
View3<T> as_stored(const View3<acc_t<T>>& x) {
  if constexpr (std::is_same<T, acc_t<T>>::value) {
    return x;
  } else {
    View3<T> out("stored", x.extent(0), x.extent(1), x.extent(2));
    convert_view<T, acc_t<T>>(out, x);
    return out;
  }
}

}  // namespace minicp::kernels
