// Attention front end: shape checks, choice of implementation, the LSE merge and the
// softmax-backward row term shared by both implementations.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/attention_impl.hpp"
#include "kernels/convert.hpp"

namespace minicp::kernels {

namespace detail {
// The bf16 dot-product extension, asked of the CPU this process runs on.
bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 9 : (defined(__GNUC__) && __GNUC__ >= 10))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}
}  // namespace detail
using detail::cpu_has_avx512_bf16;
using detail::resolve_scale;

std::string attention_isa() {
  constexpr const char* kVar = "MINICP_ATTENTION_ISA";
  const char* env = std::getenv(kVar);
  if (env == nullptr || *env == '\0') {
    if (!detail::attention_isa_choice().empty()) return detail::attention_isa_choice();  // set_attention_isa's
    return cpu_has_avx512_bf16() ? "avx512_bf16" : "plain";
  }
  const std::string v = env;
  // The value a results file records: accepted where the CPU can run it. amx-emulated, the
  // AMX kernel on the emulated tiles, runs anywhere (slowly: a check, not a path to time).
  if (v == "plain" || v == "amx-emulated") return v;
  if (v == "avx512_bf16" && cpu_has_avx512_bf16()) return v;
  if (v == "avx512_bf16")
    throw std::invalid_argument(std::string(kVar) + "=\"" + v + "\": this CPU has no avx512_bf16 (use plain)");
  if (v == "amx") {
    if (const std::string why = detail::amx_unusable(); !why.empty())
      throw std::invalid_argument(std::string(kVar) + "=\"amx\": " + why + " (use plain)");
    return v;
  }
  throw std::invalid_argument(std::string(kVar) + "=\"" + v +
                              "\": not one of plain, avx512_bf16, amx, amx-emulated (unset: the path is chosen from "
                              "the CPU flags)");
}

std::string attention_isa_error() {
  try {
    attention_isa();
    return "";
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
}

void attention_check_shapes(const char* who, int64_t Sq, int64_t H, int64_t D, int64_t Sk, int64_t Hkv, int64_t Dk,
                            int64_t Dv, int64_t Skv, int64_t Hv, const AttnMask& mask) {
  auto fail = [&](const std::string& what) { throw std::invalid_argument(std::string(who) + ": " + what); };
  if (Dk != D || Dv != D) fail("q, k, v must share head_dim (q has " + std::to_string(D) + ")");
  if (Skv != Sk || Hv != Hkv) fail("k and v must both be [Sk,Hkv,D]");
  if (Hkv <= 0 || H % Hkv != 0)
    fail("heads (" + std::to_string(H) + ") must be a multiple of kv_heads (" + std::to_string(Hkv) + ")");
  if (int64_t(mask.q_pos.extent(0)) != Sq) fail("mask.q_pos must have Sq entries");
  if (int64_t(mask.k_pos.extent(0)) != Sk) fail("mask.k_pos must have Sk entries");
  const bool qd = mask.q_doc.extent(0) != 0, kd = mask.k_doc.extent(0) != 0;
  if (qd != kd) fail("mask.q_doc and mask.k_doc must be both given or both empty");
  if (qd && (int64_t(mask.q_doc.extent(0)) != Sq || int64_t(mask.k_doc.extent(0)) != Sk))
    fail("mask.q_doc must have Sq entries and mask.k_doc Sk entries");
  if (mask.window < 0) fail("mask.window must be >= 0");
}

namespace {

// The implementation a call runs: Auto is tiled on the host, team on a device (whose build
// has no tiled kernels: attention_no_tiles.cpp).
AttnImpl resolve_impl(const AttnOptions& opt) {
  if (opt.impl == AttnImpl::Tiled && !kHostExec)
    throw std::invalid_argument("attention: the tiled implementation needs a host execution space");
  if (opt.impl != AttnImpl::Auto) return opt.impl;
  return kHostExec ? AttnImpl::Tiled : AttnImpl::Team;
}
bool use_tiled(const AttnOptions& opt) { return resolve_impl(opt) == AttnImpl::Tiled; }
bool use_team(const AttnOptions& opt) { return resolve_impl(opt) == AttnImpl::Team; }

// The bf16 tile engine a call runs: AVX512-BF16 dot products (where pairs of a head's entries
// are whole 4-byte words: even head_dim), AMX tiles or their emulation (any head_dim), or
// none: the inputs are widened (the plain path).
enum class Bf16Tiles { None, Avx512, Amx, AmxEmulated };
Bf16Tiles bf16_tiles(const AttnOptions& opt, int64_t D) {
  if (!use_tiled(opt)) return Bf16Tiles::None;
  const std::string isa = attention_isa();
  if (isa == "avx512_bf16" && D % 2 == 0) return Bf16Tiles::Avx512;
  if (isa == "amx") return Bf16Tiles::Amx;
  if (isa == "amx-emulated") return Bf16Tiles::AmxEmulated;
  return Bf16Tiles::None;
}

template <class T>
void check_fwd(CView3<T> q, CView3<T> k, CView3<T> v, const AttnMask& mask, const View3<acc_t<T>>& o,
               const View2<acc_t<T>>& lse) {
  attention_check_shapes("attention_fwd", q.extent(0), q.extent(1), q.extent(2), k.extent(0), k.extent(1), k.extent(2),
                         v.extent(2), v.extent(0), v.extent(1), mask);
  if (o.extent(0) != q.extent(0) || o.extent(1) != q.extent(1) || o.extent(2) != q.extent(2) ||
      lse.extent(0) != q.extent(0) || lse.extent(1) != q.extent(1))
    throw std::invalid_argument("attention_fwd: o must be [Sq,H,D] and lse [Sq,H]");
}

template <class T>
void check_bwd(CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<acc_t<T>> lse, CView3<T> dout,
               const AttnMask& mask, const View3<acc_t<T>>& dq, const View3<acc_t<T>>& dk, const View3<acc_t<T>>& dv) {
  attention_check_shapes("attention_bwd", q.extent(0), q.extent(1), q.extent(2), k.extent(0), k.extent(1), k.extent(2),
                         v.extent(2), v.extent(0), v.extent(1), mask);
  auto same3 = [](auto& a, auto& b) {
    return a.extent(0) == b.extent(0) && a.extent(1) == b.extent(1) && a.extent(2) == b.extent(2);
  };
  if (!same3(o, q) || !same3(dout, q) || !same3(dq, q) || !same3(dk, k) || !same3(dv, k) ||
      lse.extent(0) != q.extent(0) || lse.extent(1) != q.extent(1))
    throw std::invalid_argument("attention_bwd: o, dout, dq must be [Sq,H,D], dk, dv [Sk,Hkv,D], lse [Sq,H]");
}

}  // namespace

template <class T>
AttnStats attention_fwd(CView3<T> q, CView3<T> k, CView3<T> v, const AttnMask& mask, View3<acc_t<T>> o,
                        View2<acc_t<T>> lse, const AttnOptions& opt) {
  check_fwd<T>(q, k, v, mask, o, lse);
  const T scale = resolve_scale<T>(opt, q.extent(2));
  if (use_tiled(opt)) return detail::attention_fwd_tiled<T>(q, k, v, mask, o, lse, scale, opt.tile_q, opt.tile_k);
  if (use_team(opt))
    return detail::attention_fwd_team<T>(q, k, v, mask, o, lse, scale, opt.tile_q, opt.tile_k, opt.team_size);
  return detail::attention_fwd_portable<T>(q, k, v, mask, o, lse, scale);
}

template <class T>
AttnStats attention_bwd(CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<acc_t<T>> lse, CView3<T> dout,
                        const AttnMask& mask, View3<acc_t<T>> dq, View3<acc_t<T>> dk, View3<acc_t<T>> dv,
                        const AttnOptions& opt) {
  check_bwd<T>(q, k, v, o, lse, dout, mask, dq, dk, dv);
  const T scale = resolve_scale<T>(opt, q.extent(2));
  if (use_tiled(opt))
    return detail::attention_bwd_tiled<T>(q, k, v, o, lse, dout, mask, dq, dk, dv, scale, opt.tile_q, opt.tile_k);
  if (use_team(opt))
    return detail::attention_bwd_team<T>(q, k, v, o, lse, dout, mask, dq, dk, dv, scale, opt.tile_q, opt.tile_k,
                                         opt.team_size);
  return detail::attention_bwd_portable<T>(q, k, v, o, lse, dout, mask, dq, dk, dv, scale);
}

bool attention_bf16_widens(int head_dim) {
  return bf16_tiles(AttnOptions{}, head_dim) == Bf16Tiles::None && !use_team(AttnOptions{});
}

namespace {
// A bf16 tensor widened to fp32 in a fresh View of the same shape.
View3<float> widen(CView3<bf16> x, const char* label) {
  View3<float> w(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing), x.extent(0), x.extent(1),
                 x.extent(2));
  convert_view<float, bf16>(w, x);
  return w;
}
}  // namespace

// bf16: the bf16 tiles (AVX512-BF16, AMX or AMX emulated), or the team kernel (it reads bf16
// and computes in fp32), or the plain path: bf16 inputs widened to fp32 and the fp32 kernels
// run, so the products are those of the rounded inputs, accumulated in fp32.
template <>
AttnStats attention_fwd<bf16>(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, const AttnMask& mask, View3<float> o,
                              View2<float> lse, const AttnOptions& opt) {
  if (const Bf16Tiles tiles = bf16_tiles(opt, q.extent(2)); tiles != Bf16Tiles::None) {
    check_fwd<bf16>(q, k, v, mask, o, lse);
    const float scale = resolve_scale<float>(opt, q.extent(2));
    auto* run = tiles == Bf16Tiles::Amx           ? &detail::attention_fwd_amx
                : tiles == Bf16Tiles::AmxEmulated ? &detail::attention_fwd_amx_emulated
                                                  : &detail::attention_fwd_tiled<bf16>;
    return run(q, k, v, mask, o, lse, scale, opt.tile_q, opt.tile_k);
  }
  if (use_team(opt)) {
    check_fwd<bf16>(q, k, v, mask, o, lse);
    return detail::attention_fwd_team<bf16>(q, k, v, mask, o, lse, resolve_scale<float>(opt, q.extent(2)), opt.tile_q,
                                            opt.tile_k, opt.team_size);
  }
  return attention_fwd<float>(widen(q, "attn_q32"), widen(k, "attn_k32"), widen(v, "attn_v32"), mask, o, lse, opt);
}

template <>
AttnStats attention_bwd<bf16>(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, CView3<bf16> o, CView2<float> lse,
                              CView3<bf16> dout, const AttnMask& mask, View3<float> dq, View3<float> dk,
                              View3<float> dv, const AttnOptions& opt) {
  if (const Bf16Tiles tiles = bf16_tiles(opt, q.extent(2)); tiles != Bf16Tiles::None) {
    check_bwd<bf16>(q, k, v, o, lse, dout, mask, dq, dk, dv);
    const float scale = resolve_scale<float>(opt, q.extent(2));
    auto* run = tiles == Bf16Tiles::Amx           ? &detail::attention_bwd_amx
                : tiles == Bf16Tiles::AmxEmulated ? &detail::attention_bwd_amx_emulated
                                                  : &detail::attention_bwd_tiled<bf16>;
    return run(q, k, v, o, lse, dout, mask, dq, dk, dv, scale, opt.tile_q, opt.tile_k);
  }
  if (use_team(opt)) {
    check_bwd<bf16>(q, k, v, o, lse, dout, mask, dq, dk, dv);
    return detail::attention_bwd_team<bf16>(q, k, v, o, lse, dout, mask, dq, dk, dv,
                                            resolve_scale<float>(opt, q.extent(2)), opt.tile_q, opt.tile_k,
                                            opt.team_size);
  }
  return attention_bwd<float>(widen(q, "attn_q32"), widen(k, "attn_k32"), widen(v, "attn_v32"), widen(o, "attn_o32"),
                              lse, widen(dout, "attn_dout32"), mask, dq, dk, dv, opt);
}

template <class T>
void lse_merge(View3<T> o, View2<T> lse, CView3<T> o2, CView2<T> lse2) {
  if (o2.extent(0) != o.extent(0) || o2.extent(1) != o.extent(1) || o2.extent(2) != o.extent(2) ||
      lse.extent(0) != o.extent(0) || lse.extent(1) != o.extent(1) || lse2.extent(0) != o.extent(0) ||
      lse2.extent(1) != o.extent(1))
    throw std::invalid_argument("lse_merge: o, o2 must be [S,H,D] and lse, lse2 [S,H]");
  using A = std::common_type_t<T, float>;
  const int S = int(o.extent(0)), H = int(o.extent(1)), D = int(o.extent(2));
  Kokkos::parallel_for(
      "kernels::attention::lse_merge", Kokkos::RangePolicy<Exec>(0, S * H), KOKKOS_LAMBDA(const int idx) {
        const int s = idx / H, h = idx % H;
        const A l1 = A(lse(s, h)), l2 = A(lse2(s, h));
        const A mx = l1 > l2 ? l1 : l2;
        if (mx == neg_inf<A>()) {  // nothing visible in either part
          lse(s, h) = neg_inf<T>();
          for (int d = 0; d < D; ++d) o(s, h, d) = T(0);
          return;
        }
        const A e1 = exp(l1 - mx), e2 = exp(l2 - mx);  // exp(-inf) = 0 for an empty part
        const A tot = e1 + e2;
        const A w1 = e1 / tot, w2 = e2 / tot;
        for (int d = 0; d < D; ++d) o(s, h, d) = T(w1 * A(o(s, h, d)) + w2 * A(o2(s, h, d)));
        lse(s, h) = T(mx + log(tot));
      });
}

namespace detail {
template <class T>
View2<acc_t<T>> attention_delta(CView3<T> o, CView3<T> dout) {
  using A = acc_t<T>;
  const int S = int(o.extent(0)), H = int(o.extent(1)), D = int(o.extent(2));
  View2<A> delta(Kokkos::view_alloc("attention_delta", Kokkos::WithoutInitializing), S, H);
  Kokkos::parallel_for(
      "kernels::attention::bwd_delta", Kokkos::RangePolicy<Exec>(0, S * H), KOKKOS_LAMBDA(const int idx) {
        const int s = idx / H, h = idx % H;
        A acc = 0;
        for (int d = 0; d < D; ++d) acc += A(dout(s, h, d)) * A(o(s, h, d));
        delta(s, h) = acc;
      });
  return delta;
}
template View2<float> attention_delta<bf16>(CView3<bf16>, CView3<bf16>);
}  // namespace detail

#define MINICP_ATTN_INST(T)                                                                                 \
  template AttnStats attention_fwd<T>(CView3<T>, CView3<T>, CView3<T>, const AttnMask&, View3<T>, View2<T>, \
                                      const AttnOptions&);                                                  \
  template AttnStats attention_bwd<T>(CView3<T>, CView3<T>, CView3<T>, CView3<T>, CView2<T>, CView3<T>,     \
                                      const AttnMask&, View3<T>, View3<T>, View3<T>, const AttnOptions&);   \
  template void lse_merge<T>(View3<T>, View2<T>, CView3<T>, CView2<T>);                                     \
  template View2<T> detail::attention_delta<T>(CView3<T>, CView3<T>);
MINICP_ATTN_INST(float)
MINICP_ATTN_INST(double)
#undef MINICP_ATTN_INST

}  // namespace minicp::kernels
