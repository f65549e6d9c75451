// A stack of L Llama-style decoder layers on one rank of a CP group, forward and backward:
//   x -> RMSNorm -> Q, K, V projections -> RoPE (global positions) -> CP attention (any
//   scheme) -> output projection -> + x -> RMSNorm -> SwiGLU MLP (silu(h W1) * (h W3)) W2 -> + .
// Each layer has its own weights (one flat buffer, model::layer_params order) and its own
// cp::Scheme object (ring schemes keep a K/V block between forward and backward). Weight
// gradients are summed over the CP group, or with data parallelism over the CP x DP group
// and averaged over DP (each DP replica runs its own sequence): each layer's all-reduce
// starts as soon as its dW are final and runs during the backward of the layers below; the
// time still blocked on them at the end is the exposed all-reduce time. Letters: see model.hpp.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "comm/mesh.hpp"
#include "miniapp/cp/scheme.hpp"
#include "miniapp/model/model.hpp"

namespace minicp::model {

using kernels::View1;
using kernels::View2;
using kernels::View3;

// train: forward and backward over S tokens; prefill: forward only; decode: T new tokens
// (on every rank) through the layers against a KV cache of S tokens sharded over the ranks.
enum class Pass { Train, Prefill, Decode };
const char* to_string(Pass p);

// Where a layer's time goes (seconds, fenced). Attention: compute is the scheme's time not
// blocked on communication, comm its time blocked in waits (cp::Stats::comm_wait_s).
// TpComm: the tensor-parallel collectives (all-gathers and reduce-scatters with sequence
// parallelism, all-reduces without), blocking. GradAllreduce: posting the layer's dW
// all-reduce, and (after the last layer) the wait for what is left of it. Other: the layer's measured wall time less
// its timed phases (and, for the layer that runs last, the stack's own time around the layers), so the phases of all
// layers add up to the forward or backward call.
enum class Phase : int { Norm, Qkv, Rope, AttnCompute, AttnComm, OutProj, Mlp, TpComm, GradAllreduce, Other, Count };
const char* to_string(Phase p);
constexpr int kPhases = int(Phase::Count);
struct PhaseTimes {
  double s[kPhases] = {};
  double total() const;
  PhaseTimes& operator+=(const PhaseTimes& o);
};

// The weight gradients of a layer are all-reduced in buckets of at most this many bytes,
// each its own non-blocking all-reduce. Measured with minicp-comm-bench on the development
// VM (Open MPI 4.1, 2 ranks, shared memory): an all-reduce of up to 16 MiB ran at 5 GB/s
// bus bandwidth, one of 32 MiB or more at 0.2 GB/s; a cpu-small layer's 45 MB in one piece
// took 350 ms, in 8 MiB buckets about 10 ms. (Data-parallel trainers bucket for the same
// reason, and to start the first bucket early.)
constexpr size_t kGradBucketBytes = size_t(8) << 20;

struct StackConfig {
  Shape shape;
  Pass pass = Pass::Train;
  cp::Config attn;    // seq_len, ranks, mask, scheme settings, mode; heads etc. are set from shape
  uint64_t seed = 1;  // the generator's seed for weights, inputs, dy and the cache
  // bf16 stacks: the weight gradients are rounded to bf16 and summed over the group in bf16
  // (half the bytes), instead of summed in fp32. No effect on fp32 and fp64 stacks.
  bool bf16_grad_allreduce = false;
  // The job's mesh. With tp or dp above 1 the communicator's job is the mesh's ranks and its
  // world this rank's CP group (Communicator::narrow_world). TP: each TP rank holds its slice
  // of every layer (model::tp_slice) and the CP scheme runs on its heads; the TP group's
  // collectives join the slices. DP: each replica runs its own sequence (inputs and upstream
  // gradient drawn for its replica index). The weight gradients are all-reduced over the
  // CP x DP group and divided by dp. The default, 1 x 1 x 1, is a pure CP group.
  comm::Mesh mesh;
  // With TP: Megatron's sequence parallelism. The norms and residuals run on this rank's
  // 1/tp of the CP shard's rows; an all-gather before QKV and before the MLP, a
  // reduce-scatter after O and after down (the backward: their transposes). Off, or on a
  // decode pass (T new tokens, not split): every TP rank holds the CP shard's rows whole and
  // the O and down outputs (the backward's dh) are all-reduced over TP.
  bool sequence_parallel = true;
  // With TP: each collective in flight beside the GEMMs that do not read what it brings. An
  // all-gather runs beside the GEMMs on the rank's own rows (the other rows' follow it); a
  // backward reduce of dh beside the weight-gradient GEMMs. The forward's reduces, which the
  // next operation reads at once, stay waited for. Off: every collective waited for at once.
  bool tp_overlap = false;
  // The replica whose sequence a stack without DP in its mesh runs: a single-rank reference of
  // replica d's sequence. A mesh with DP sets it from the rank's DP coordinate.
  int replica = 0;
};

// Bytes per value of the weight-gradient all-reduce of a stack of elem-byte stored values:
// the fp32 gradients themselves, or with bf16_grad_allreduce their bf16 copies.
inline size_t grad_allreduce_elem(const StackConfig& cfg, size_t elem) {
  return cfg.bf16_grad_allreduce ? elem : kernels::acc_size(elem);
}

// The stack's job as a mesh: cfg.mesh with its CP degree cfg.attn.ranks (the default mesh,
// 1 x 1 x 1, stands for a pure CP group of any size).
inline comm::Mesh job_mesh(const StackConfig& cfg) {
  return comm::Mesh(cfg.mesh.tp(), cfg.attn.ranks, cfg.mesh.dp(), cfg.mesh.order());
}

// The layer a TP rank of the stack holds (every TP rank's has the same sizes): cfg.shape as
// tp_slice splits it, or whole without TP or where tp cannot split it (check_mesh refuses that).
Shape rank_shape(const StackConfig& cfg);
// Whether the stack runs sequence parallel: TP above 1, the key on, and not a decode pass.
bool sequence_parallel(const StackConfig& cfg);

// The attention config of a stack: cfg.attn with the shape's heads, kv_heads (with TP, one
// TP rank's: model::tp_slice), head_dim and the pass's problem.
cp::Config attention_config(const StackConfig& cfg);

// "" when the stack's mesh can run its shape on this scheme, else why not, naming the mesh:
// TP must split the heads, K/V heads and FFN (check_tp), and with sequence parallelism every
// CP rank's tokens must divide by tp. What Stack's constructor refuses, before it allocates;
// the sweep refuses it before anything runs.
std::string check_mesh(const StackConfig& cfg, const cp::SchemeInfo& scheme);

// One TP collective of a layer as Stack runs it: its kind, payload (comm::bytes_leaving's) and
// group size (the TP group, or the ranks that hold one replicated K/V head).
struct TpCall {
  comm::EventKind op;
  int64_t payload;
  int group;
  double beside_flops = 0;  // GEMM FLOPs run while it is in flight (StackConfig::tp_overlap)
};
// The TP collectives of one layer's forward or backward, in the order Stack posts them, on a
// rank whose CP shard holds N rows, with elem-byte stored values: with sequence parallelism an
// all-gather of the rank's N/tp rows before QKV and before the MLP and a reduce-scatter after
// O and after down (the backward: the transposes, then the norms' gradients all-reduced);
// without it an all-reduce after O and after down (the backward: of dh, twice); and the
// replicated K/V heads' gradients all-reduced over their holders. Empty without TP.
std::vector<TpCall> tp_calls(const StackConfig& cfg, int64_t N, bool backward, size_t elem);

// Bytes this rank holds for a stack (weights, gradients, saved activations, workspace, the
// KV cache, the scheme's workspace per layer): the memory model of --dry-run. It predicts the
// high-water mark of the Kokkos allocations of a forward and a backward on the rank that holds
// most (tests/test_memory_model.cpp holds it to within 15% of harness::MemTracker's count).
int64_t predicted_stack_bytes(const StackConfig& cfg, const cp::SchemeInfo& scheme, size_t elem);

// T: the stored value type (fp64, fp32 or bf16). Weights, activations and activation
// gradients are T; weight gradients, RMSNorm's rstd and the LSE are kernels::acc_t<T> (fp32
// for bf16), as mixed-precision training keeps them.
template <class T>
class Stack {
 public:
  using A = kernels::acc_t<T>;
  // Collective over comm's world (the CP group). Weights, inputs (x [N, C]), the upstream
  // gradient (dy [N, C]) and the decode cache are drawn from the generator.
  Stack(const StackConfig& cfg, const cp::SchemeInfo& scheme, comm::Communicator& comm);
  ~Stack();

  void forward(cp::Context& ctx);   // x -> y through the L layers
  void backward(cp::Context& ctx);  // train: dy -> dx, and every layer's dW summed over the group

  // This rank's rows (global token index of row i: rows()[i]; decode: the T new tokens). With
  // sequence parallelism, its TP rank's 1/tp of the CP shard's.
  const std::vector<int64_t>& rows() const;
  View2<T> x() const;                // [N, C] input of layer 0
  View2<T> y() const;                // [N, C] output of layer L-1
  View2<T> dy() const;               // [N, C] upstream gradient
  View2<T> dx() const;               // [N, C]
  View1<T> params(int layer) const;  // [layer_param_count of its TP slice]
  View1<A> grads(int layer) const;   // the same, after backward: summed over the group
  // The whole layer's parameters and weight gradients [layer_param_count(shape)], the TP
  // slices put together (collective over the TP group; without TP: params() and grads()).
  View1<T> whole_params(int layer) const;
  View1<A> whole_grads(int layer) const;
  // Bytes this rank's TP collectives sent in the last forward and backward (comm::bytes_leaving).
  int64_t tp_bytes() const;
  // Decode: this rank's shard of layer l's KV cache [Nc, Hkv, D] (K after RoPE) and the
  // global token index of each of its rows; empty for the other passes.
  View3<T> cache_k(int layer) const;
  View3<T> cache_v(int layer) const;
  // The same with every K/V head [Nc, kv_heads, D] (collective over the TP group).
  View3<T> whole_cache_k(int layer) const;
  View3<T> whole_cache_v(int layer) const;
  // Whether this rank's rows stand for its TP group's: without sequence parallelism every
  // TP rank holds the same rows, and TP rank 0 is the one that writes them.
  bool owns_rows() const;
  const std::vector<int64_t>& cache_rows() const;
  // Per-layer phase times of the last forward / backward.
  const PhaseTimes& forward_times(int layer) const;
  const PhaseTimes& backward_times(int layer) const;
  // Seconds the last backward spent blocked on the weight-gradient all-reduces: posting
  // them, and waiting at its end for what was left.
  double grad_allreduce_exposed_s() const;
  // Bytes this rank's dW all-reduces sent in the last backward (comm::bytes_leaving): the
  // part of the communicator's bytes_sent() that is not the scheme's.
  int64_t grad_allreduce_bytes() const;
  // Seconds the communicator's collective thread spent running them in the last backward:
  // the all-reduces' own cost, whatever ran beside them (NaN without such a thread).
  double grad_allreduce_busy_s() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

}  // namespace minicp::model
