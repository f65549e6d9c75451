// The AMX attention engine (attention_amx.hpp) with its tile operations as no-ops: everything
// the amx path does between its tile products (packing the operands, the masks, the online
// softmax, the C tiles' loads and stores to memory) and nothing of them, so any host measures
// the rate the amx path cannot pass however fast its tiles run (minicp-kernels-bench's
// BM_Attention*AmxNoTiles, the kernel study). Its outputs are not attention: a bound, not a path.
// Compiled with the library's flags, as attention_amx.cpp is apart from the AMX ones.
#include "kernels/attention_impl.hpp"

#define MINICP_AMX_NS no_tiles
#include "kernels/attention_amx.hpp"

namespace minicp::kernels::detail {

namespace {
// The tile interface doing nothing; load and store keep their pointer live, as a tile
// instruction would read and write its memory.
struct NoTiles {
  static constexpr const char* kAttnName = "_amx_no_tiles";
  static void configure() {}
  static void release() {}
  template <int T>
  static void zero() {}
  template <int T>
  static void load(const void* p, std::ptrdiff_t) {
    asm volatile("" : : "r"(p) : "memory");
  }
  template <int T>
  static void store(void* p, std::ptrdiff_t) {
    asm volatile("" : : "r"(p) : "memory");
  }
  template <int C, int A, int B>
  static void dpbf16ps() {}
};
using Engine = tiled::no_tiles::AmxEngine<NoTiles>;
}  // namespace

AttnStats attention_fwd_amx_no_tiles(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, const AttnMask& mask,
                                     View3<float> o, View2<float> lse, float scale, int tile_q, int tile_k) {
  return tiled::fwd<Engine>(q, k, v, mask, o, lse, scale, tile_q, tile_k);
}

AttnStats attention_bwd_amx_no_tiles(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, CView3<bf16> o, CView2<float> lse,
                                     CView3<bf16> dout, const AttnMask& mask, View3<float> dq, View3<float> dk,
                                     View3<float> dv, float scale, int tile_q, int tile_k) {
  return tiled::bwd<Engine>(q, k, v, o, lse, dout, mask, dq, dk, dv, scale, tile_q, tile_k);
}

}  // namespace minicp::kernels::detail
