// The model a run describes: its shape (presets and explicit keys), the parameters of one
// decoder layer, the FLOPs the figures of merit count, and the generator every tensor is
// drawn from.
//
// Dimension letters, named once for miniapp/model/:
//   L  layers                 S    global tokens (decode: tokens in the KV cache)
//   P  ranks of the CP group  N    tokens on this rank (train: S/P; decode: T)
//   T  decode tokens          C    hidden size
//   H  query heads            Hkv  key/value heads        D  head dim
//   F  MLP inner (ffn) width
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace minicp::model {

struct Shape {
  int hidden = 0;    // C
  int heads = 0;     // H
  int kv_heads = 0;  // Hkv
  int head_dim = 0;  // D
  int ffn = 0;       // F
  int layers = 0;    // L
  double rope_theta = 10000;
  double norm_eps = 1e-5;
};

struct Preset {
  std::string name;
  Shape shape;
};
// tiny, cpu-small, llama3-8b, llama3-70b.
const std::vector<Preset>& presets();
// nullptr when there is no preset of that name.
const Shape* find_preset(const std::string& name);
// "" when the shape can be built, else one sentence naming the deck key (model.<key>), its
// value and what is allowed.
std::string check(const Shape& m);

// One parameter of a layer, y = x @ W convention: W is [rows, cols] (cols == 0: a vector
// [rows]). All parameters of a layer live in one flat buffer, at `offset`, so that the
// weight gradients of a layer are all-reduced in one call.
struct Param {
  std::string name;
  int64_t rows = 0, cols = 0;
  int64_t offset = 0;
  int64_t size() const { return cols == 0 ? rows : rows * cols; }
};
// attn_norm [C], wq [C, H*D], wk, wv [C, Hkv*D], wo [H*D, C], mlp_norm [C],
// w1, w3 [C, F], w2 [F, C], in that order.
std::vector<Param> layer_params(const Shape& m);
int64_t layer_param_count(const Shape& m);

// Tensor parallelism, Megatron's layout: TP rank t of tp holds query heads [t*H/tp, ...),
// the K/V heads they read (Hkv/tp of them or, when Hkv < tp, the one their group shares,
// replicated on tp/Hkv consecutive ranks, as Megatron replicates them), and FFN columns
// [t*F/tp, ...). Its part is a layer of `shape`: Wq, Wk, Wv, W1 and W3 are its columns of the
// whole layer's (column-parallel), Wo and W2 its rows (row-parallel), the norms whole.
struct TpSlice {
  int tp = 1, rank = 0;
  Shape shape;                  // this rank's part: heads, kv_heads and ffn its own
  int head0 = 0, kv_head0 = 0;  // its first query head and K/V head in the whole layer
  int64_t ffn0 = 0;             // its first FFN column
  int kv_copies = 1;            // TP ranks that hold its K/V heads (tp / Hkv when replicated)
};
// "" when the shape splits over tp ranks, else one sentence naming sweep.tp, its value and
// what it must divide.
std::string check_tp(const Shape& m, int tp);
TpSlice tp_slice(const Shape& m, int tp, int rank);
// Where the slice's parameters sit in the whole layer: element i of parameter p
// (layer_params order) of the slice's flat buffer is element at(p, i) of the whole layer's.
class TpMap {
 public:
  TpMap(const Shape& whole, const TpSlice& s);
  int64_t at(int p, int64_t i) const;
  const std::vector<Param>& mine() const { return mine_; }    // layer_params(s.shape)
  const std::vector<Param>& whole() const { return whole_; }  // layer_params(whole)

 private:
  TpSlice s_;
  int64_t D_ = 0;
  std::vector<Param> mine_, whole_;
};
// Whether the slice's copy of parameter p is the one that stands for the TP group's: every
// slice of a split parameter; of a whole one (the norms) rank 0's; of replicated K/V heads
// the first of the ranks that hold them.
bool tp_owner(const TpSlice& s, int p);

// Useful FLOPs of one layer (the figure of merit): the GEMMs (2*M*N*K each: Q, K, V, O
// projections and the three MLP matrices) plus attention's useful FLOPs (causal: the
// visible half, kernels::attention_*_useful_flops). Train counts the forward and the
// backward (GEMMs twice more: dX and dW; attention 2.5x its forward); prefill and decode
// the forward. Nq query tokens attend to Nk keys (train, prefill: Nq = Nk = S; decode:
// Nq = T, Nk = S + T, the T new tokens seeing the whole cache and, causally, each other).
struct LayerFlops {
  double gemm = 0, attention = 0;
  double total() const { return gemm + attention; }
};
LayerFlops layer_flops(const Shape& m, double Nq, double Nk, bool causal, bool train, bool decode);

// The generator: a value in [-1, 1) from (seed, stream, index). A tensor's stream names it
// (kind, layer, parameter) and the index is its GLOBAL element index (token-major), so the
// same seed gives the same tensors for every scheme, rank count and layout.
double gen_unit(uint64_t seed, uint64_t stream, uint64_t index);
enum class Stream : uint64_t { Input = 1, UpstreamGrad = 2, CacheK = 3, CacheV = 4, Weight = 5 };
inline uint64_t stream_id(Stream s, int layer = 0, int param = 0) {
  return (uint64_t(s) << 40) | (uint64_t(layer) << 16) | uint64_t(param);
}

}  // namespace minicp::model
