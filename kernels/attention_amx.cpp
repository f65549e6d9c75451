// The bf16 tiled attention on Intel AMX: attention_amx.hpp's engine on the intrinsics. This
// file alone is compiled with -mamx-tile -mamx-bf16 (kernels/CMakeLists.txt, where the
// compiler takes them: MINICP_AMX_INTRINSICS), so the rest of the build stays generic; its
// kernels run only where amx_unusable() is empty.
//
// Linux hands out the tile data state (8 KiB per thread) only on request:
// arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), once per process, before the first
// tile instruction; without it that instruction faults. A refusal (a kernel before 5.16, a
// hypervisor that hides the state) is a reason, not a crash: amx_unusable() says it. So is a
// tile probe that faults or disagrees with the emulation (amx::probe_check).
#include <cerrno>
#include <cstring>
#include <string>

#include "kernels/attention_impl.hpp"

#if defined(MINICP_AMX_INTRINSICS) && defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MINICP_AMX_NS hardware
#include "kernels/attention_amx.hpp"

// OP(t) with the literal t equal to the template argument T (0..7).
#define MINICP_EACH_TILE(T, OP)               \
  static_assert(T >= 0 && T < 8, "tile 0-7"); \
  if constexpr (T == 0)                       \
    OP(0);                                    \
  else if constexpr (T == 1)                  \
    OP(1);                                    \
  else if constexpr (T == 2)                  \
    OP(2);                                    \
  else if constexpr (T == 3)                  \
    OP(3);                                    \
  else if constexpr (T == 4)                  \
    OP(4);                                    \
  else if constexpr (T == 5)                  \
    OP(5);                                    \
  else if constexpr (T == 6)                  \
    OP(6);                                    \
  else                                        \
    OP(7)

namespace minicp::kernels {
namespace amx {
// The tile operations on the CPU's tiles: palette 1, all eight tiles 16 rows x 64 bytes.
struct AmxTiles {
  static constexpr const char* kAttnName = "_amx";
  static void configure() {
    alignas(64) unsigned char cfg[64] = {};
    cfg[0] = 1;  // palette 1
    for (int t = 0; t < 8; ++t) {
      const uint16_t colsb = kTileBytes;
      std::memcpy(cfg + 16 + 2 * t, &colsb, sizeof colsb);
      cfg[48 + t] = kTileRows;
    }
    _tile_loadconfig(cfg);
  }
  static void release() { _tile_release(); }
  // GCC's tile intrinsics are macros that paste their tile number into the instruction's
  // text, so each number is spelt out.
  template <int T>
  static void zero() {
    MINICP_EACH_TILE(T, _tile_zero);
  }
  template <int T>
  static void load(const void* p, std::ptrdiff_t stride) {
#define MINICP_TILE_LOAD(t) _tile_loadd(t, p, stride)
    MINICP_EACH_TILE(T, MINICP_TILE_LOAD);
#undef MINICP_TILE_LOAD
  }
  template <int T>
  static void store(void* p, std::ptrdiff_t stride) {
#define MINICP_TILE_STORE(t) _tile_stored(t, p, stride)
    MINICP_EACH_TILE(T, MINICP_TILE_STORE);
#undef MINICP_TILE_STORE
  }
  // The four products of attention_amx.hpp's 2 x 2 block: C tiles 0-3, A 4-5, B 6-7.
  template <int C, int A, int B>
  static void dpbf16ps() {
    static_assert(C >= 0 && C < 4 && A == 4 + C / 2 && B == 6 + C % 2, "the block's products only");
    if constexpr (C == 0)
      _tile_dpbf16ps(0, 4, 6);
    else if constexpr (C == 1)
      _tile_dpbf16ps(1, 4, 7);
    else if constexpr (C == 2)
      _tile_dpbf16ps(2, 5, 6);
    else
      _tile_dpbf16ps(3, 5, 7);
  }
};
#undef MINICP_EACH_TILE

namespace {
constexpr int kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;

// "" once the CPU has AMX-TILE and AMX-BF16 and the kernel granted the tile state, else why not.
std::string why_unusable() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return "this CPU reports no leaf 7 of cpuid";
  if (!(d & (1u << 24)) || !(d & (1u << 22))) return "this CPU has no amx_tile and amx_bf16";
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0)
    return std::string("the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM: ") +
           std::strerror(errno) + ")";
  unsigned long long granted = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &granted) != 0 || !(granted & (1ull << kXfeatureXtiledata)))
    return "the kernel did not grant the AMX tile state";
  // Every tile operation once, faults caught, against the emulation: a CPU or hypervisor
  // that takes the flags but not the instructions as the emulation reads them is a reason too.
  return probe_check<AmxTiles>(detail::amx_emulated_probe());
}
}  // namespace
}  // namespace amx

namespace detail {

std::string amx_unusable() {
  static const std::string why = amx::why_unusable();  // asked once per process
  return why;
}

AttnStats attention_fwd_amx(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, const AttnMask& mask, View3<float> o,
                            View2<float> lse, float scale, int tile_q, int tile_k) {
  if (const std::string why = amx_unusable(); !why.empty()) throw std::logic_error("attention_fwd_amx: " + why);
  return tiled::fwd<tiled::hardware::AmxEngine<amx::AmxTiles>>(q, k, v, mask, o, lse, scale, tile_q, tile_k);
}

AttnStats attention_bwd_amx(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, CView3<bf16> o, CView2<float> lse,
                            CView3<bf16> dout, const AttnMask& mask, View3<float> dq, View3<float> dk, View3<float> dv,
                            float scale, int tile_q, int tile_k) {
  if (const std::string why = amx_unusable(); !why.empty()) throw std::logic_error("attention_bwd_amx: " + why);
  return tiled::bwd<tiled::hardware::AmxEngine<amx::AmxTiles>>(q, k, v, o, lse, dout, mask, dq, dk, dv, scale, tile_q,
                                                               tile_k);
}

bool amx_tile_products(int M, int N, int K, int products) {
  if (!amx_unusable().empty()) return false;
  namespace t = tiled::hardware;
  const std::vector<bf16> x(size_t(M) * K, bf16(1.0f)), y(size_t(K) * N, bf16(0.5f));
  t::OperandA a;
  t::OperandB b;
  t::a_rows(a, x.data(), K, M, K);
  t::b_rows(b, y.data(), N, K, N);
  std::vector<float> c(size_t(M) * N);
  const t::AmxEngine<amx::AmxTiles>::Session session;
  for (int p = 0; p < products; ++p) t::gemm<amx::AmxTiles>(M, N, a, b, c.data(), N, p > 0);
  return true;
}

}  // namespace detail
}  // namespace minicp::kernels

#else  // a compiler without the AMX intrinsics, or not x86-64 Linux

namespace minicp::kernels::detail {

std::string amx_unusable() { return "this build has no AMX kernel (the compiler lacks -mamx-tile -mamx-bf16)"; }

AttnStats attention_fwd_amx(CView3<bf16>, CView3<bf16>, CView3<bf16>, const AttnMask&, View3<float>, View2<float>,
                            float, int, int) {
  throw std::logic_error("attention_fwd_amx: " + amx_unusable());
}

AttnStats attention_bwd_amx(CView3<bf16>, CView3<bf16>, CView3<bf16>, CView3<bf16>, CView2<float>, CView3<bf16>,
                            const AttnMask&, View3<float>, View3<float>, View3<float>, float, int, int) {
  throw std::logic_error("attention_bwd_amx: " + amx_unusable());
}

bool amx_tile_products(int, int, int, int) { return false; }

}  // namespace minicp::kernels::detail

#endif
