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

}  // namespace minicp::kernels
