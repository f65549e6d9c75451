// Presets, shape checks, the layer's parameter table, FLOP counts and the generator.
#include "miniapp/model/model.hpp"

#include "kernels/attention.hpp"

namespace minicp::model {

const std::vector<Preset>& presets() {
  static const std::vector<Preset> table = {
      {"tiny", {64, 4, 2, 16, 176, 2, 10000, 1e-5}},
      {"cpu-small", {1024, 8, 2, 128, 2816, 2, 500000, 1e-5}},
      {"llama3-8b", {4096, 32, 8, 128, 14336, 32, 500000, 1e-5}},
      {"llama3-70b", {8192, 64, 8, 128, 28672, 80, 500000, 1e-5}},
  };
  return table;
}

const Shape* find_preset(const std::string& name) {
  for (const Preset& p : presets())
    if (p.name == name) return &p.shape;
  return nullptr;
}

std::string check(const Shape& m) {
  auto bad = [](const char* key, auto v, const char* allowed) {
    return std::string("model.") + key + " = " + std::to_string(v) + ": " + allowed;
  };
  if (m.hidden < 1) return bad("hidden", m.hidden, "must be >= 1");
  if (m.heads < 1) return bad("heads", m.heads, "must be >= 1");
  if (m.kv_heads < 1 || m.heads % m.kv_heads != 0)
    return bad("kv_heads", m.kv_heads,
               ("must be >= 1 and divide model.heads (" + std::to_string(m.heads) + ")").c_str());
  if (m.head_dim < 2 || m.head_dim % 2 != 0) return bad("head_dim", m.head_dim, "must be even and >= 2");
  if (m.ffn < 1) return bad("ffn", m.ffn, "must be >= 1");
  if (m.layers < 1) return bad("layers", m.layers, "must be >= 1");
  if (!(m.rope_theta > 1)) return "model.rope_theta = " + std::to_string(m.rope_theta) + ": must be > 1";
  if (!(m.norm_eps > 0)) return "model.norm_eps = " + std::to_string(m.norm_eps) + ": must be > 0";
  return "";
}

std::string check_tp(const Shape& m, int tp) {
  auto bad = [&](const std::string& what) { return "sweep.tp = " + std::to_string(tp) + ": must " + what; };
  if (tp < 1) return bad("be >= 1");
  if (m.heads % tp != 0) return bad("divide model.heads (" + std::to_string(m.heads) + ")");
  if (m.ffn % tp != 0) return bad("divide model.ffn (" + std::to_string(m.ffn) + ")");
  if (m.kv_heads % tp != 0 && tp % m.kv_heads != 0)
    return bad("divide model.kv_heads (" + std::to_string(m.kv_heads) +
               ") or be a multiple of it (K/V heads replicated)");
  return "";
}

TpSlice tp_slice(const Shape& m, int tp, int rank) {
  TpSlice s;
  s.tp = tp, s.rank = rank, s.shape = m;
  s.shape.heads = m.heads / tp, s.shape.ffn = m.ffn / tp;
  s.kv_copies = m.kv_heads >= tp ? 1 : tp / m.kv_heads;
  s.shape.kv_heads = m.kv_heads >= tp ? m.kv_heads / tp : 1;
  s.head0 = rank * s.shape.heads;
  s.kv_head0 = m.kv_heads >= tp ? rank * s.shape.kv_heads : rank / s.kv_copies;
  s.ffn0 = int64_t(rank) * s.shape.ffn;
  return s;
}

TpMap::TpMap(const Shape& whole, const TpSlice& s)
    : s_(s), D_(whole.head_dim), mine_(layer_params(s.shape)), whole_(layer_params(whole)) {}

int64_t TpMap::at(int p, int64_t i) const {
  const Param &mine = mine_[size_t(p)], &whole = whole_[size_t(p)];
  if (mine.cols == 0) return whole.offset + i;  // a norm: whole on every rank
  int64_t r = i / mine.cols, c = i % mine.cols;
  // attn_norm, wq, wk, wv, wo, mlp_norm, w1, w3, w2: the axis split, and where the slice starts on it
  switch (p) {
    case 1: c += s_.head0 * D_; break;  // wq: its heads' columns
    case 2:                             // wk, wv: its K/V heads' columns
    case 3: c += s_.kv_head0 * D_; break;
    case 4: r += s_.head0 * D_; break;  // wo: its heads' rows
    case 6:                             // w1, w3: its FFN columns
    case 7: c += s_.ffn0; break;
    case 8: r += s_.ffn0; break;  // w2: its FFN rows
    default: break;
  }
  return whole.offset + r * whole.cols + c;
}

bool tp_owner(const TpSlice& s, int p) {
  if (p == 0 || p == 5) return s.rank == 0;                // the norms
  if (p == 2 || p == 3) return s.rank % s.kv_copies == 0;  // K/V heads, maybe replicated
  return true;
}

std::vector<Param> layer_params(const Shape& m) {
  const int64_t C = m.hidden, HD = int64_t(m.heads) * m.head_dim, KD = int64_t(m.kv_heads) * m.head_dim, F = m.ffn;
  std::vector<Param> ps = {{"attn_norm", C, 0, 0}, {"wq", C, HD, 0}, {"wk", C, KD, 0},
                           {"wv", C, KD, 0},       {"wo", HD, C, 0}, {"mlp_norm", C, 0, 0},
                           {"w1", C, F, 0},        {"w3", C, F, 0},  {"w2", F, C, 0}};
  int64_t off = 0;
  for (Param& p : ps) {
    p.offset = off;
    off += p.size();
  }
  return ps;
}

int64_t layer_param_count(const Shape& m) {
  const auto ps = layer_params(m);
  return ps.back().offset + ps.back().size();
}

LayerFlops layer_flops(const Shape& m, double Nq, double Nk, bool causal, bool train, bool decode) {
  const double C = m.hidden, H = m.heads, Hkv = m.kv_heads, D = m.head_dim, F = m.ffn;
  LayerFlops f;
  f.gemm = 2.0 * Nq * C * (H * D + 2 * Hkv * D) + 2.0 * Nq * H * D * C + 3 * 2.0 * Nq * C * F;
  if (decode) {  // the cache in full, the new tokens' own block causally (or in full)
    const double cache = Nk - Nq;
    f.attention = kernels::attention_fwd_useful_flops(Nq, cache, D, H, false) +
                  kernels::attention_fwd_useful_flops(Nq, Nq, D, H, causal);
  } else {
    f.attention = kernels::attention_fwd_useful_flops(Nq, Nk, D, H, causal);
  }
  if (train) {
    f.gemm *= 3;
    f.attention *= 1 + 2.5;
  }
  return f;
}

double gen_unit(uint64_t seed, uint64_t stream, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + stream * 0xD1B54A32D192ED03ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

}  // namespace minicp::model
