// Definitions and the fp32 / fp64 / bf16 instantiations of kernels/rope.hpp (compiled with the
// kernels' flags, so the loops vectorise for the build host).
#include "kernels/rope.hpp"

#include <stdexcept>

namespace minicp::kernels {

template <class T>
void rope_apply(View3<T> x, Kokkos::View<const int64_t*, Mem> pos, double theta, bool inverse) {
  const int S = static_cast<int>(x.extent(0)), H = static_cast<int>(x.extent(1)), D = static_cast<int>(x.extent(2));
  if (D % 2 != 0) throw std::invalid_argument("rope: head_dim must be even");
  if (pos.extent(0) != x.extent(0)) throw std::invalid_argument("rope: pos must have one entry per row of x");
  if (!(theta > 1.0)) throw std::invalid_argument("rope: theta must be > 1");
  const int half = D / 2;
  const double sgn = inverse ? -1.0 : 1.0;
  // The angles depend on (row, i) only: computed once per row and pair, applied to every head.
  Kokkos::View<double*, Mem> freq(Kokkos::view_alloc(std::string("kernels::rope::freq"), Kokkos::WithoutInitializing),
                                  half);
  Kokkos::parallel_for(
      "kernels::rope::freq", Kokkos::RangePolicy<Exec>(0, half),
      KOKKOS_LAMBDA(const int i) { freq(i) = pow(theta, -2.0 * double(i) / double(D)); });
  Kokkos::parallel_for(
      inverse ? "kernels::rope::bwd" : "kernels::rope::fwd",
      Kokkos::RangePolicy<Exec, Kokkos::IndexType<int64_t>>(0, int64_t(S) * half), KOKKOS_LAMBDA(const int64_t idx) {
        const int i = int(idx % half);
        const int s = int(idx / half);
        const double ang = double(pos(s)) * freq(i);
        const double c = cos(ang), sn = sgn * sin(ang);
        for (int h = 0; h < H; ++h) {
          const double x1 = double(x(s, h, i)), x2 = double(x(s, h, i + half));
          x(s, h, i) = T(x1 * c - x2 * sn);
          x(s, h, i + half) = T(x2 * c + x1 * sn);
        }
      });
}

template void rope_apply<float>(View3<float>, Kokkos::View<const int64_t*, Mem>, double, bool);
template void rope_apply<double>(View3<double>, Kokkos::View<const int64_t*, Mem>, double, bool);
template void rope_apply<bf16>(View3<bf16>, Kokkos::View<const int64_t*, Mem>, double, bool);

}  // namespace minicp::kernels
