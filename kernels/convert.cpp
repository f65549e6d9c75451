#include "kernels/convert.hpp"

namespace minicp::kernels {

template <class To, class From>
void convert(To* dst, const From* src, int64_t n) {
  for_each_index("kernels::convert", n, KOKKOS_LAMBDA(const int64_t i) { dst[i] = To(acc_t<From>(src[i])); });
}

template void convert<bf16, float>(bf16*, const float*, int64_t);
template void convert<float, bf16>(float*, const bf16*, int64_t);
template void convert<bf16, double>(bf16*, const double*, int64_t);
template void convert<double, bf16>(double*, const bf16*, int64_t);
template void convert<float, double>(float*, const double*, int64_t);
template void convert<double, float>(double*, const float*, int64_t);

}  // namespace minicp::kernels
