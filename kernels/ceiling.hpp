// The GEMM ceiling of one rank: the fastest rate (FLOP/s) at which the GEMM engines the layer
// uses run on this machine, with this rank's threads. It is the reference of the layer
// efficiency (docs/figures-of-merit.md, "Layer efficiency"), which therefore cannot exceed 1 unless the
// measurement is wrong: the layer's GEMMs run on BLAS and its attention tiles on
// tile::gemm, and a BLAS held to a slow core (a user's OPENBLAS_CORETYPE) would otherwise
// make a reference below what the attention kernels reach.
#pragma once
#include <cstdint>
#include <functional>

namespace minicp::kernels {

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
};

struct GemmCeiling {
  double blas_square = 0;  // BLAS SGEMM 2048^3, best of 3 after a warm-up
  double blas_layer = 0;   // BLAS SGEMM at the layer's largest GEMM shape, best of 3; 0: no shape given
  double tile = 0;         // the attention tile kernel, 128x256x128 products on every thread; 0 off the host
  double best() const;     // the largest of the three: the ceiling
};

// The components, each the best of 3 timed runs after an untimed one. sync runs before each
// (a barrier over the ranks that share the machine, so they measure at the same time, as the
// cases run). BLAS: small shapes are repeated so one timed run does about 2 GFLOP.
double blas_gemm_rate(GemmShape s, const std::function<void()>& sync);
double tile_gemm_rate(const std::function<void()>& sync);

// All three (blas_layer skipped for an empty shape). Takes about 0.1-1 s.
GemmCeiling measure_gemm_ceiling(GemmShape layer, const std::function<void()>& sync);

// The ceiling of a bf16 layer (run.dtype = "bf16"): its GEMMs run on gemm<bf16> (oneDNN's
// bf16 matmul, fp32 accumulation, where built with it: gemm_bf16_engine() names it), so the
// reference is that engine's rate, not SGEMM's.
struct Bf16GemmCeiling {
  double square = 0;  // gemm<bf16> 2048^3, best of 3 after a warm-up
  double layer = 0;   // gemm<bf16> at the layer's largest GEMM shape, best of 3; 0: no shape given
  double tile = 0;    // the bf16 attention tile kernel (bf16_tile_gemm_rate); 0 where there is none
  double best() const;
};

// gemm<bf16> at shape s, timed as blas_gemm_rate.
double bf16_gemm_rate(GemmShape s, const std::function<void()>& sync);
// The bf16 attention tile kernel's rate on every thread, measured as tile_gemm_rate measures
// the fp32 one. 0 (not part of the ceiling) where bf16 attention widens to fp32 and runs the
// fp32 tiles (attention_isa() "plain") and off the host.
double bf16_tile_gemm_rate(const std::function<void()>& sync);

// All three (layer skipped for an empty shape). Takes about 0.1-1 s.
Bf16GemmCeiling measure_bf16_gemm_ceiling(GemmShape layer, const std::function<void()>& sync);

}  // namespace minicp::kernels
