// Blockwise (flash) attention forward/backward with log-sum-exp, GQA, and masks decided
// from GLOBAL query/key positions (causal, full, sliding window, packed documents), so
// one call serves any CP layout and any ring step. Three implementations, one interface:
//   tiled    - host only: tile products on a register-blocked kernel (tile_gemm.hpp), online
//              softmax with a vectorised exp, fully masked tiles skipped. The host's path;
//              bf16 on AVX512-BF16 dot products where the CPU has them (attention_isa()).
//   team     - the same flash algorithm in Kokkos hierarchical parallelism (a team per tile,
//              tiles in team scratch), any execution space: the device's path.
//   portable - one Kokkos thread per (row, head), scalar loops; a second implementation for
//              the tests.
// Tensors: q[Sq,H,D], k,v[Sk,Hkv,D], o[Sq,H,D], lse[Sq,H]; H % Hkv == 0 (head h uses kv
// head h / (H/Hkv)). LSE is the natural log of sum_j exp(scale * q.k_j); -inf when no key
// is visible, and then the output row is 0.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/types.hpp"

namespace minicp::kernels {

// Which keys a query sees. Key j is visible from query i iff
//   (!causal || kpos[j] <= qpos[i]) && (window == 0 || qpos[i]-window < kpos[j] <= qpos[i])
//   && (no documents || qdoc[i] == kdoc[j]).
// A window implies causal. Empty doc views (extent 0) mean one document.
struct AttnMask {
  Kokkos::View<const int64_t*, Mem> q_pos, k_pos;
  Kokkos::View<const int32_t*, Mem> q_doc, k_doc;
  bool causal = true;
  int64_t window = 0;

  KOKKOS_INLINE_FUNCTION bool has_docs() const { return q_doc.extent(0) != 0; }
  KOKKOS_INLINE_FUNCTION bool visible(int i, int j) const {
    const int64_t qp = q_pos(i), kp = k_pos(j);
    if ((causal || window > 0) && kp > qp) return false;
    if (window > 0 && kp <= qp - window) return false;
    if (has_docs() && q_doc(i) != k_doc(j)) return false;
    return true;
  }
};

// Auto: tiled on a host execution space, team on a device.
enum class AttnImpl { Auto, Tiled, Portable, Team };

struct AttnOptions {
  double scale = 0.0;          // softmax scale; 0 means 1/sqrt(D)
  int tile_q = 0, tile_k = 0;  // tiled and team tile sizes in tokens; 0 picks the default
  int team_size = 0;           // team path: threads per team; 0 lets Kokkos choose (AUTO)
  AttnImpl impl = AttnImpl::Auto;
};

// The tiled path's default tiles, for the record: "forward 256x128, backward 128x128 (q x k tokens)".
std::string attention_tiles();
// The same tiles as numbers (q x k tokens), for the performance model's tile counts.
struct AttnTiles {
  int q = 0, k = 0;
};
AttnTiles attention_default_tiles(bool backward);

// What a call actually computed (for load-imbalance and executed-FLOP accounting).
struct AttnStats {
  double flops = 0;             // executed FLOPs (whole tiles, masked entries included)
  int64_t blocks_computed = 0;  // (head, q-tile, k-tile) blocks computed
  int64_t blocks_skipped = 0;   // blocks skipped because fully masked
  AttnStats& operator+=(const AttnStats& o) {
    flops += o.flops;
    blocks_computed += o.blocks_computed;
    blocks_skipped += o.blocks_skipped;
    return *this;
  }
};

// Useful FLOPs (the figure of merit): forward 4*Sq*Sk*D*H, half of it when causal over a
// square; backward 2.5x forward.
inline double attention_fwd_useful_flops(double Sq, double Sk, double D, double H, bool causal) {
  return 4.0 * Sq * Sk * D * H * (causal ? 0.5 : 1.0);
}
inline double attention_bwd_useful_flops(double Sq, double Sk, double D, double H, bool causal) {
  return 2.5 * attention_fwd_useful_flops(Sq, Sk, D, H, causal);
}

// Forward: o, lse are overwritten. They are in the accumulator type (fp32 for bf16 inputs),
// so a scheme merges partial results over key blocks before it rounds once.
template <class T>
AttnStats attention_fwd(CView3<T> q, CView3<T> k, CView3<T> v, const AttnMask& mask, View3<acc_t<T>> o,
                        View2<acc_t<T>> lse, const AttnOptions& opt = {});

// Backward given the FINAL o and lse of the rows (so a ring may call it once per KV block):
// dq, dk, dv are accumulated into (+=), never zeroed here, in the accumulator type; o and
// dout are the stored (rounded) tensors, as a training step has them.
template <class T>
AttnStats attention_bwd(CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<acc_t<T>> lse, CView3<T> dout,
                        const AttnMask& mask, View3<acc_t<T>> dq, View3<acc_t<T>> dk, View3<acc_t<T>> dv,
                        const AttnOptions& opt = {});

// The path bf16 attention takes, for the record: "avx512_bf16" (the tiled loops with bf16
// tiles and AVX512-BF16 dot products, fp32 accumulation), "amx" (the same loops on AMX
// tiles), "amx-emulated" (the AMX kernel on the tiles' exact emulation: a check), or "plain"
// (inputs widened to fp32, the fp32 kernels). MINICP_ATTENTION_ISA forces one (plain,
// avx512_bf16 or amx where the CPU can run it, amx-emulated anywhere; any other value throws
// std::invalid_argument). Unset or empty: the path set_attention_isa chose (a run measures
// them), else avx512_bf16 where the CPU has it, else plain. Only the tiled implementation
// has the bf16 tiles, and avx512_bf16 needs an even head_dim; the rest runs plain.
std::string attention_isa();

// One bf16 attention path as measure_attention_paths timed it: its rates (FLOP/s), or why it
// did not run (refused: "" when it ran).
struct AttnPathRate {
  std::string isa;
  double fwd_flops_per_s = 0, bwd_flops_per_s = 0;
  std::string refused;
};
// Every bf16 path but amx-emulated, in the order below, each with refused "" where this
// process can run it on head_dim D, else why not (no rates): plain; avx512_bf16 (the CPU's
// flag, an even D); amx (amx_unusable(): the CPU, the build, Linux's tile state, the tile
// probe). Off the host: empty.
std::vector<AttnPathRate> attention_paths_here(int head_dim);
// Times each bf16 path this process can run on a causal forward and backward of 512 tokens,
// 2 heads per thread, head_dim D, default tiles, on every thread, each for min_s seconds:
// those attention_paths_here lets run, amx only where its start-up check (the kernel gives
// its emulation's results bit for bit) passes too; the others listed with the reason. Empty
// where MINICP_ATTENTION_ISA forces a path, and off the host. Takes about 6 x min_s plus the
// warm-ups.
std::vector<AttnPathRate> measure_attention_paths(int head_dim, double min_s = 0.005);
// The path of the smallest training-step time per forward FLOP among those that ran (plain
// when none did).
std::string fastest_attention_path(const std::vector<AttnPathRate>& rates);
// "plain fwd 240.1 bwd 262.0 GFLOP/s; avx512_bf16 ...; amx not run (why)", for the record.
std::string describe_attention_paths(const std::vector<AttnPathRate>& rates);
// The path attention_isa() returns from now on where MINICP_ATTENTION_ISA is unset (a run
// sets the measured choice, the same on every rank).
void set_attention_isa(const std::string& isa);
// The check of MINICP_ATTENTION_ISA a program makes while it parses (so a bad value is bad
// input, refused before anything runs): "" when attention_isa() accepts it, else its message.
std::string attention_isa_error();

// bf16 is implemented on its own (attention.cpp); declared so every caller links to it.
template <>
AttnStats attention_fwd<bf16>(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, const AttnMask& mask, View3<float> o,
                              View2<float> lse, const AttnOptions& opt);
template <>
AttnStats attention_bwd<bf16>(CView3<bf16> q, CView3<bf16> k, CView3<bf16> v, CView3<bf16> o, CView2<float> lse,
                              CView3<bf16> dout, const AttnMask& mask, View3<float> dq, View3<float> dk,
                              View3<float> dv, const AttnOptions& opt);

// fp32 values the attention kernels allocate during one call on sq query rows and skv key
// rows beyond their arguments (the memory model counts them): the bf16 path that widens its
// inputs to fp32 holds q, k, v and, in the backward, o and dout widened. Nothing for fp32
// and fp64 (their backward's row term is counted with the tensors a caller hands over).
// Whether a bf16 attention call of this head_dim with default options widens its inputs (the
// plain path) rather than running the bf16 tiles.
bool attention_bf16_widens(int head_dim);
inline double attention_scratch_values(size_t elem, double sq, double skv, int heads, int kv_heads, int head_dim,
                                       bool backward) {
  if (elem != sizeof(bf16) || !attention_bf16_widens(head_dim)) return 0;
  const double q = sq * heads * head_dim, kv = skv * kv_heads * head_dim;
  return (backward ? 3 : 1) * q + 2 * kv;
}

// Merge a partial result into a running one: (o, lse) <- merge((o, lse), (o2, lse2)), in
// the accumulator type (fp32 or fp64: a bf16 attention's partial results are fp32); rows with both LSEs -inf give o =
// 0, lse = -inf, never NaN.
template <class T>
void lse_merge(View3<T> o, View2<T> lse, CView3<T> o2, CView2<T> lse2);

// Throws std::invalid_argument naming the mismatch; used by both implementations.
void attention_check_shapes(const char* who, int64_t Sq, int64_t H, int64_t D, int64_t Sk, int64_t Hkv, int64_t Dk,
                            int64_t Dv, int64_t Skv, int64_t Hv, const AttnMask& mask);

}  // namespace minicp::kernels
