#include "kernels/convert.hpp"

namespace minicp::kernels {

namespace {
template <class To, class From>
KOKKOS_INLINE_FUNCTION To convert_one(From x) {
  if constexpr (std::is_same<To, bf16>::value && std::is_same<From, double>::value) {
    return bf16::from_double(x);
  } else {
    return To(acc_t<From>(x));
  }
}
}  // namespace

template <class To, class From>
void convert(To* dst, const From* src, int64_t n) {
  for_each_index(
      "kernels::convert", n, KOKKOS_LAMBDA(const int64_t i) { dst[i] = convert_one<To, From>(src[i]); });
}

template void convert<bf16, float>(bf16*, const float*, int64_t);
template void convert<float, bf16>(float*, const bf16*, int64_t);
template void convert<bf16, double>(bf16*, const double*, int64_t);
template void convert<double, bf16>(double*, const bf16*, int64_t);
template void convert<float, double>(float*, const double*, int64_t);
template void convert<double, float>(double*, const float*, int64_t);
// Same type (a copy): the CP schemes' generic paths name convert<T, acc_t<T>> for every T, and
// nvcc keeps those references where g++ drops them as unreachable.
template void convert<float, float>(float*, const float*, int64_t);
template void convert<double, double>(double*, const double*, int64_t);

}  // namespace minicp::kernels
