// Internal: the two attention implementations behind kernels::attention_fwd/bwd.
#pragma once
#include <cmath>
#include <string>

#include "kernels/attention.hpp"

namespace minicp::kernels {
namespace amx {
struct ProbeIO;  // amx_tiles.hpp
}  // namespace amx
}  // namespace minicp::kernels

namespace minicp::kernels::detail {

// The softmax scale of a call: opt.scale, or 1/sqrt(D) where it is 0.
template <class T>
T resolve_scale(const AttnOptions& opt, int64_t D) {
  return opt.scale != 0.0 ? T(opt.scale) : T(1.0 / std::sqrt(double(D)));
}

template <class T>
AttnStats attention_fwd_portable(CView3<T> q, CView3<T> k, CView3<T> v, const AttnMask& mask, View3<T> o, View2<T> lse,
                                 T scale);
template <class T>
AttnStats attention_bwd_portable(CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<T> lse, CView3<T> dout,
                                 const AttnMask& mask, View3<T> dq, View3<T> dk, View3<T> dv, T scale);
// The tiled path: T = float, double (attention_tiled.cpp) and bf16 (attention_bf16.cpp,
// AVX512-BF16 products; called only where attention_isa() is "avx512_bf16").
template <class T>
AttnStats attention_fwd_tiled(CView3<T> q, CView3<T> k, CView3<T> v, const AttnMask& mask, View3<acc_t<T>> o,
                              View2<acc_t<T>> lse, acc_t<T> scale, int tile_q, int tile_k);
template <class T>
AttnStats attention_bwd_tiled(CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<acc_t<T>> lse, CView3<T> dout,
                              const AttnMask& mask, View3<acc_t<T>> dq, View3<acc_t<T>> dk, View3<acc_t<T>> dv,
                              acc_t<T> scale, int tile_q, int tile_k);
template <>
AttnStats attention_fwd_tiled<bf16>(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, const AttnMask& mask,
                                    View3<float> o, View2<float> lse, float scale, int tile_q, int tile_k);
template <>
AttnStats attention_bwd_tiled<bf16>(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, CView3<bf16> o, CView2<float> lse,
                                    CView3<bf16> dout, const AttnMask& mask, View3<float> dq, View3<float> dk,
                                    View3<float> dv, float scale, int tile_q, int tile_k);

// The bf16 tiled attention on AMX tiles (attention_amx.cpp: the intrinsics; called only
// where amx_unusable() is "") and on their exact emulation (attention_amx_emulated.cpp, any
// host). Both run attention_amx.hpp's engine.
AttnStats attention_fwd_amx(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, const AttnMask& mask, View3<float> o,
                            View2<float> lse, float scale, int tile_q, int tile_k);
AttnStats attention_bwd_amx(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, CView3<bf16> o, CView2<float> lse,
                            CView3<bf16> dout, const AttnMask& mask, View3<float> dq, View3<float> dk, View3<float> dv,
                            float scale, int tile_q, int tile_k);
AttnStats attention_fwd_amx_emulated(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, const AttnMask& mask,
                                     View3<float> o, View2<float> lse, float scale, int tile_q, int tile_k);
AttnStats attention_bwd_amx_emulated(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, CView3<bf16> o, CView2<float> lse,
                                     CView3<bf16> dout, const AttnMask& mask, View3<float> dq, View3<float> dk,
                                     View3<float> dv, float scale, int tile_q, int tile_k);
// The AMX engine with its tile operations as no-ops (attention_amx_no_tiles.cpp): its work
// between the tile products alone, timed as the bound of the amx path. Not attention.
AttnStats attention_fwd_amx_no_tiles(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, const AttnMask& mask,
                                     View3<float> o, View2<float> lse, float scale, int tile_q, int tile_k);
AttnStats attention_bwd_amx_no_tiles(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, CView3<bf16> o, CView2<float> lse,
                                     CView3<bf16> dout, const AttnMask& mask, View3<float> dq, View3<float> dk,
                                     View3<float> dv, float scale, int tile_q, int tile_k);
// amx::probe on the tiles' emulation (attention_amx_emulated.cpp): what the CPU's tiles
// must give at start-up.
amx::ProbeIO amx_emulated_probe();
// Whether this CPU has AVX512-BF16 (attention.cpp).
bool cpu_has_avx512_bf16();
// The path set_attention_isa chose ("" while none is set; attention_paths.cpp).
const std::string& attention_isa_choice();
// The AMX engine's tile products on their own, for the GEMM ceiling, as bf16_tile_products
// runs them (false, nothing run, where amx_unusable() is not "").
bool amx_tile_products(int M, int N, int K, int products);
// "" where this process can run the AMX kernel (the CPU has amx_tile and amx_bf16, the build
// has the intrinsics, Linux granted the tile state: asked once), else why not.
std::string amx_unusable();

// The bf16 tile kernel on its own, for the GEMM ceiling (ceiling.cpp): `products` products
// C (M, N) = A (M, K) B (K, N) of in-cache bf16 tiles, B packed once, on the calling thread,
// as the forward's score product runs them: on AMX tiles where attention_isa() is "amx",
// on AVX512-BF16 where it is "avx512_bf16". False (nothing run) elsewhere: bf16 attention then
// widens to fp32 and has no tile kernel of its own (amx-emulated: a check, not a rate).
bool bf16_tile_products(int M, int N, int K, int products);

// The team path (attention_team.cpp): T = float, double and bf16, any execution space.
template <class T>
AttnStats attention_fwd_team(CView3<T> q, CView3<T> k, CView3<T> v, const AttnMask& mask, View3<acc_t<T>> o,
                             View2<acc_t<T>> lse, acc_t<T> scale, int tile_q, int tile_k, int team_size);
template <class T>
AttnStats attention_bwd_team(CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<acc_t<T>> lse, CView3<T> dout,
                             const AttnMask& mask, View3<acc_t<T>> dq, View3<acc_t<T>> dk, View3<acc_t<T>> dv,
                             acc_t<T> scale, int tile_q, int tile_k, int team_size);

// Delta[i,h] = sum_d dout[i,h,d] * o[i,h,d] (the softmax-backward row term), in acc_t<T>.
template <class T>
View2<acc_t<T>> attention_delta(CView3<T> o, CView3<T> dout);

}  // namespace minicp::kernels::detail
