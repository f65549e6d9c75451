// The AMX attention engine (attention_amx.hpp) on the exact emulation of the tile operations
// (amx::EmulatedTiles), so every host runs the AMX kernel: MINICP_ATTENTION_ISA="amx-emulated"
// selects it, the tests hold it to the fp64 reference, and an AMX host to the intrinsics bit
// for bit. About 100x slower than the CPU's tiles: a check, not a path to time. Compiled with
// -ffp-contract=off (kernels/CMakeLists.txt): each product and each sum rounds on its own.
#include "kernels/attention_impl.hpp"

#define MINICP_AMX_NS emulated
#include "kernels/attention_amx.hpp"

namespace minicp::kernels::detail {

amx::ProbeIO amx_emulated_probe() {
  amx::ProbeIO io;
  amx::probe<amx::EmulatedTiles>(io);
  return io;
}

AttnStats attention_fwd_amx_emulated(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, const AttnMask& mask,
                                     View3<float> o, View2<float> lse, float scale, int tile_q, int tile_k) {
  return tiled::fwd<tiled::emulated::AmxEngine<amx::EmulatedTiles>>(q, k, v, mask, o, lse, scale, tile_q, tile_k);
}

AttnStats attention_bwd_amx_emulated(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, CView3<bf16> o, CView2<float> lse,
                                     CView3<bf16> dout, const AttnMask& mask, View3<float> dq, View3<float> dk,
                                     View3<float> dv, float scale, int tile_q, int tile_k) {
  return tiled::bwd<tiled::emulated::AmxEngine<amx::EmulatedTiles>>(q, k, v, o, lse, dout, mask, dq, dk, dv, scale,
                                                                    tile_q, tile_k);
}

}  // namespace minicp::kernels::detail
