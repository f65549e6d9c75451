// The GEMM ceiling (see ceiling.hpp). Compiled with the kernels' -march and -ffp-contract=fast
// so tile::gemm here is the attention kernels' own.
#include "kernels/ceiling.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <vector>

#include "kernels/attention_impl.hpp"
#include "kernels/gemm.hpp"
#ifdef MINICP_HOST_TILES
#include "kernels/tile_gemm.hpp"
#endif

namespace minicp::kernels {
namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Best of `reps` timed runs of f (after one untimed), each after sync; the rate of `flops`.
template <class F>
double best_rate(double flops, int reps, const std::function<void()>& sync, F&& f) {
  double best = 1e300;
  for (int i = 0; i <= reps; ++i) {
    sync();
    const double t0 = now();
    f();
    Kokkos::fence();
    if (i > 0) best = std::min(best, now() - t0);
  }
  return flops / best;
}

// The rate of gemm<T> at shape s. Small shapes run several times per timing, so a rep lasts
// long enough to time.
template <class T>
double gemm_rate(GemmShape s, const std::function<void()>& sync) {
  View2<T> A("ceiling_a", s.m, s.k), B("ceiling_b", s.k, s.n), C("ceiling_c", s.m, s.n);
  Kokkos::deep_copy(A, T(1.0f));
  Kokkos::deep_copy(B, T(0.5f));
  const double one = gemm_flops(double(s.m), double(s.n), double(s.k));
  const int inner = int(std::clamp(2e9 / one, 1.0, 1000.0));
  return best_rate(one * inner, 3, sync, [&] {
    for (int i = 0; i < inner; ++i) gemm<T>(Trans::N, Trans::N, 1.0f, A, B, 0.0f, C);
  });
}

}  // namespace

double blas_gemm_rate(GemmShape s, const std::function<void()>& sync) { return gemm_rate<float>(s, sync); }
double bf16_gemm_rate(GemmShape s, const std::function<void()>& sync) { return gemm_rate<bf16>(s, sync); }

// Every thread multiplies its own in-cache tiles: C (128, 256) = A (128, 128) Bp (128, 256),
// the attention forward's score product, with B packed once as the kernels do.
double tile_gemm_rate(const std::function<void()>& sync) {
#ifndef MINICP_HOST_TILES
  (void)sync;
  return 0;  // a device build: no tile kernel (kernels/CMakeLists.txt)
#else
  constexpr int M = 128, N = 256, K = 128, kProducts = 256;
  const int threads = int(HostExec().concurrency());
  const double flops = gemm_flops(M, N, K) * kProducts * threads;
  auto run = [&] {
    Kokkos::parallel_for("kernels::ceiling::tile", Kokkos::RangePolicy<HostExec>(0, threads), [&](const int) {
      std::vector<float> a(M * K, 1.0f), b(K * N, 0.5f), bp(tile::packed_size<float>(K, N)), c(M * N);
      tile::pack(K, N, b.data(), N, bp.data());
      for (int p = 0; p < kProducts; ++p) tile::gemm_packed(M, N, K, a.data(), K, 1, bp.data(), c.data(), N, p > 0);
    });
  };
  return best_rate(flops, 3, sync, run);
#endif
}

// The same products on the bf16 tile kernel; 0 where there is none (detail::bf16_tile_products).
double bf16_tile_gemm_rate(const std::function<void()>& sync) {
  constexpr int M = 128, N = 256, K = 128, kProducts = 256;
  if (!kHostExec || !detail::bf16_tile_products(M, N, K, 1)) return 0;
  const int threads = int(HostExec().concurrency());
  return best_rate(gemm_flops(M, N, K) * kProducts * threads, 3, sync, [&] {
    Kokkos::parallel_for("kernels::ceiling::tile_bf16", Kokkos::RangePolicy<HostExec>(0, threads),
                         [&](const int) { detail::bf16_tile_products(M, N, K, kProducts); });
  });
}

double GemmCeiling::best() const { return std::max({blas_square, blas_layer, tile}); }
double Bf16GemmCeiling::best() const { return std::max({square, layer, tile}); }

namespace {
// {2048^3, the layer's shape (0 for none), tile} of gemm<T> and its tile kernel.
template <class T>
std::array<double, 3> components(GemmShape layer, const std::function<void()>& sync,
                                 double (*tile)(const std::function<void()>&)) {
  std::array<double, 3> r{};
  r[0] = gemm_rate<T>({2048, 2048, 2048}, sync);
  if (layer.m > 0 && layer.n > 0 && layer.k > 0) r[1] = gemm_rate<T>(layer, sync);
  r[2] = tile(sync);
  return r;
}
}  // namespace

GemmCeiling measure_gemm_ceiling(GemmShape layer, const std::function<void()>& sync) {
  const std::array<double, 3> r = components<float>(layer, sync, tile_gemm_rate);
  return {r[0], r[1], r[2]};
}

Bf16GemmCeiling measure_bf16_gemm_ceiling(GemmShape layer, const std::function<void()>& sync) {
  const std::array<double, 3> r = components<bf16>(layer, sync, bf16_tile_gemm_rate);
  return {r[0], r[1], r[2]};
}

}  // namespace minicp::kernels
