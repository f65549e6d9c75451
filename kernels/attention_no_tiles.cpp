// The tiled attention kernels of a device build: none. The tiled path (attention_tiled.cpp,
// attention_bf16.cpp, attention_amx*.cpp) is host code that a device build never calls (attention.cpp's
// resolve_impl refuses it off the host, and Auto picks the team kernel there), so a CUDA
// build compiles this file in their place (kernels/CMakeLists.txt) and links.
#include <stdexcept>

#include "kernels/amx_tiles.hpp"
#include "kernels/attention_impl.hpp"

namespace minicp::kernels::detail {

namespace {
[[noreturn]] void no_tiles() { throw std::logic_error("attention: this build has no tiled (host) kernels"); }
}  // namespace

template <class T>
AttnStats attention_fwd_tiled(CView3<T>, CView3<T>, CView3<T>, const AttnMask&, View3<acc_t<T>>, View2<acc_t<T>>,
                              acc_t<T>, int, int) {
  no_tiles();
}
template <class T>
AttnStats attention_bwd_tiled(CView3<T>, CView3<T>, CView3<T>, CView3<T>, CView2<acc_t<T>>, CView3<T>, const AttnMask&,
                              View3<acc_t<T>>, View3<acc_t<T>>, View3<acc_t<T>>, acc_t<T>, int, int) {
  no_tiles();
}
template <>
AttnStats attention_fwd_tiled<bf16>(CView3<bf16>, CView3<bf16>, CView3<bf16>, const AttnMask&, View3<float>,
                                    View2<float>, float, int, int) {
  no_tiles();
}
template <>
AttnStats attention_bwd_tiled<bf16>(CView3<bf16>, CView3<bf16>, CView3<bf16>, CView3<bf16>, CView2<float>, CView3<bf16>,
                                    const AttnMask&, View3<float>, View3<float>, View3<float>, float, int, int) {
  no_tiles();
}
bool bf16_tile_products(int, int, int, int) { return false; }
AttnStats attention_fwd_amx(CView3<bf16>, CView3<bf16>, CView3<bf16>, const AttnMask&, View3<float>, View2<float>,
                            float, int, int) {
  no_tiles();
}
AttnStats attention_bwd_amx(CView3<bf16>, CView3<bf16>, CView3<bf16>, CView3<bf16>, CView2<float>, CView3<bf16>,
                            const AttnMask&, View3<float>, View3<float>, View3<float>, float, int, int) {
  no_tiles();
}
AttnStats attention_fwd_amx_emulated(CView3<bf16>, CView3<bf16>, CView3<bf16>, const AttnMask&, View3<float>,
                                     View2<float>, float, int, int) {
  no_tiles();
}
AttnStats attention_bwd_amx_emulated(CView3<bf16>, CView3<bf16>, CView3<bf16>, CView3<bf16>, CView2<float>,
                                     CView3<bf16>, const AttnMask&, View3<float>, View3<float>, View3<float>, float,
                                     int, int) {
  no_tiles();
}
AttnStats attention_fwd_amx_no_tiles(CView3<bf16>, CView3<bf16>, CView3<bf16>, const AttnMask&, View3<float>,
                                     View2<float>, float, int, int) {
  no_tiles();
}
AttnStats attention_bwd_amx_no_tiles(CView3<bf16>, CView3<bf16>, CView3<bf16>, CView3<bf16>, CView2<float>,
                                     CView3<bf16>, const AttnMask&, View3<float>, View3<float>, View3<float>, float,
                                     int, int) {
  no_tiles();
}
std::string amx_unusable() { return "this build has no tiled (host) kernels"; }
// The emulation is portable C++ and its probe runs anywhere (the tests hold it to its rules).
amx::ProbeIO amx_emulated_probe() {
  amx::ProbeIO io;
  amx::probe<amx::EmulatedTiles>(io);
  return io;
}

#define MINICP_NO_TILES(T)                                                                                           \
  template AttnStats attention_fwd_tiled<T>(CView3<T>, CView3<T>, CView3<T>, const AttnMask&, View3<acc_t<T>>,       \
                                            View2<acc_t<T>>, acc_t<T>, int, int);                                    \
  template AttnStats attention_bwd_tiled<T>(CView3<T>, CView3<T>, CView3<T>, CView3<T>, CView2<acc_t<T>>, CView3<T>, \
                                            const AttnMask&, View3<acc_t<T>>, View3<acc_t<T>>, View3<acc_t<T>>,      \
                                            acc_t<T>, int, int);
MINICP_NO_TILES(float)
MINICP_NO_TILES(double)
#undef MINICP_NO_TILES

}  // namespace minicp::kernels::detail
