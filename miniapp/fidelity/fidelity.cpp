// See fidelity.hpp. Letters: S tokens, P ranks, H, Hkv heads, D head dim (DESIGN.md).
#include "miniapp/fidelity/fidelity.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>

#include "kernels/attention.hpp"
#include "miniapp/cp/scheme.hpp"
#include "miniapp/model/layer.hpp"

namespace minicp::fidelity {

using Vec = std::vector<double>;

const char* to_string(Variant v) {
  switch (v) {
    case Variant::F32: return "f32";
    case Variant::BF16: return "bf16";
    case Variant::BF16Wire: return "bf16-wire";
  }
  return "?";
}

namespace {

// The value every precision is handed: the generator's, rounded to bf16 as a bf16 tensor
// stores it (through fp32, as kernels::bf16 converts).
double on_bf16_grid(double x) { return double(float(kernels::bf16(float(x)))); }

// Sums of one tensor's error over the ranks' rows.
struct ErrorSum {
  double sq_diff = 0, sq_ref = 0, max_diff = 0, max_ref = 0;
  void add(double got, double want) {
    if (std::isinf(want) && got == want) return;  // a row that sees no key: -inf in both
    const double d = std::abs(got - want);
    sq_diff += d * d, sq_ref += want * want;
    max_diff = std::max(max_diff, std::isnan(d) ? INFINITY : d);
    max_ref = std::max(max_ref, std::abs(want));
  }
  // Collective over MPI_COMM_WORLD's ranks that take part (all of them).
  void reduce() {
    double s[2] = {sq_diff, sq_ref}, m[2] = {max_diff, max_ref};
    MPI_Allreduce(MPI_IN_PLACE, s, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, m, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    sq_diff = s[0], sq_ref = s[1], max_diff = m[0], max_ref = m[1];
  }
  double rel_fro() const { return sq_ref > 0 ? std::sqrt(sq_diff / sq_ref) : std::sqrt(sq_diff); }
  double max_rel() const { return max_ref > 0 ? max_diff / max_ref : max_diff; }
};

// got holds `rows` of a (*, width) tensor (row i is global row rows[i] - first); want is the
// whole reference. counted: this rank's rows count (false: another rank holds the same rows).
ErrorSum error_of(const Vec& got, const std::vector<int64_t>& rows, int64_t first, int64_t width, const Vec& want,
                  bool counted) {
  ErrorSum e;
  if (counted)
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t c = 0; c < width; ++c)
        e.add(got[i * size_t(width) + size_t(c)], want[size_t((rows[i] - first) * width + c)]);
  e.reduce();
  return e;
}

template <class V>
Vec to_vec(const V& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  Vec out(v.span());
  for (size_t i = 0; i < v.span(); ++i) out[i] = double(kernels::acc_t<typename V::non_const_value_type>(h.data()[i]));
  return out;
}

template <class T>
kernels::View3<T> view_of(const char* label, const Vec& data, size_t n0, size_t n1, size_t n2) {
  kernels::View3<T> v(std::string(label), n0, n1, n2);
  auto h = Kokkos::create_mirror_view(v);
  for (size_t i = 0; i < v.span(); ++i) h.data()[i] = T(data[i]);
  Kokkos::deep_copy(v, h);
  return v;
}

Vec rows_of(const Vec& g, const std::vector<int64_t>& idx, int64_t first, int64_t width) {
  Vec out;
  out.reserve(idx.size() * size_t(width));
  for (int64_t t : idx) out.insert(out.end(), g.begin() + (t - first) * width, g.begin() + (t - first + 1) * width);
  return out;
}

// One attention problem: the global inputs on the bf16 grid, and its config.
struct Problem {
  cp::Config cfg;
  int64_t Sq = 0, q0 = 0;
  Vec q, k, v, dout;  // (Sq, H, D), (S, Hkv, D), (S, Hkv, D), (Sq, H, D)
};

Vec draw(uint64_t stream, size_t n, double amp) {
  Vec x(n);
  for (size_t i = 0; i < n; ++i) x[i] = on_bf16_grid(amp * model::gen_unit(29, stream, i));
  return x;
}

struct Outputs {
  Vec o, lse, dq, dk, dv;
};

// Runs `scheme` in T on this rank's rows of p (its shard at the communicator's size).
template <class T>
Outputs run_scheme(const cp::SchemeInfo& info, const Problem& p, comm::Communicator& comm) {
  const cp::Config& c = p.cfg;
  const int H = c.heads, Hkv = c.kv_heads, D = c.head_dim;
  const cp::Shard sh = info.shard(c, comm.world().rank);
  const size_t sq = sh.q.size(), skv = sh.kv.size();
  const auto Q = view_of<T>("fid_q", rows_of(p.q, sh.q, p.q0, H * D), sq, H, D);
  const auto K = view_of<T>("fid_k", rows_of(p.k, sh.kv, 0, Hkv * D), skv, Hkv, D);
  const auto V = view_of<T>("fid_v", rows_of(p.v, sh.kv, 0, Hkv * D), skv, Hkv, D);
  const auto dO = view_of<T>("fid_dout", rows_of(p.dout, sh.q, p.q0, H * D), sq, H, D);
  kernels::View3<T> O("fid_o", sq, H, D), dQ("fid_dq", sq, H, D), dK("fid_dk", skv, Hkv, D), dV("fid_dv", skv, Hkv, D);
  kernels::View2<kernels::acc_t<T>> L("fid_lse", sq, H);
  cp::Context ctx{comm, c};
  const auto scheme = cp::make_scheme<T>(info);
  scheme->forward(ctx, Q, K, V, O, L);
  Outputs out{to_vec(O), to_vec(L), {}, {}, {}};
  if (c.problem == cp::Problem::Train) {
    scheme->backward(ctx, Q, K, V, O, L, dO, dQ, dK, dV);
    out.dq = to_vec(dQ), out.dk = to_vec(dK), out.dv = to_vec(dV);
  }
  return out;
}

// fp64 kernels on the whole problem: the reference every figure is measured against.
Outputs reference(const Problem& p) {
  const cp::Config& c = p.cfg;
  const int H = c.heads, Hkv = c.kv_heads, D = c.head_dim;
  const int64_t S = c.seq_len;
  std::vector<int64_t> qi(static_cast<size_t>(p.Sq)), ki(static_cast<size_t>(S));
  for (int64_t i = 0; i < p.Sq; ++i) qi[size_t(i)] = p.q0 + i;
  for (int64_t j = 0; j < S; ++j) ki[size_t(j)] = j;
  cp::Config one = c;
  one.ranks = 1;
  const auto mask = cp::make_mask(one, qi, ki);
  const auto Q = view_of<double>("ref_q", p.q, p.Sq, H, D), K = view_of<double>("ref_k", p.k, S, Hkv, D),
             V = view_of<double>("ref_v", p.v, S, Hkv, D), dO = view_of<double>("ref_dout", p.dout, p.Sq, H, D);
  kernels::View3<double> O("ref_o", p.Sq, H, D), dQ("ref_dq", p.Sq, H, D), dK("ref_dk", S, Hkv, D),
      dV("ref_dv", S, Hkv, D);
  kernels::View2<double> L("ref_lse", p.Sq, H);
  kernels::attention_fwd<double>(Q, K, V, mask, O, L, c.attn);
  Outputs out{to_vec(O), to_vec(L), {}, {}, {}};
  if (c.problem == cp::Problem::Train) {
    kernels::attention_bwd<double>(Q, K, V, O, L, dO, mask, dQ, dK, dV, c.attn);
    out.dq = to_vec(dQ), out.dk = to_vec(dK), out.dv = to_vec(dV);
  }
  return out;
}

template <class T>
Outputs run_variant(const cp::SchemeInfo& info, Problem p, bool wire, comm::Communicator& comm) {
  p.cfg.bf16_dkv = wire;
  p.cfg.ranks = comm.world().size;
  return run_scheme<T>(info, p, comm);
}

}  // namespace

namespace {
// The attention level's config of a case at `ranks`.
cp::Config attention_case(const cp::SchemeInfo& info, const Mask& mask, int64_t seq_len, int heads, int kv_heads,
                          int head_dim, int ranks) {
  cp::Config c;
  c.problem = info.solves(cp::Problem::Train) ? cp::Problem::Train : cp::Problem::Decode;
  c.seq_len = seq_len, c.heads = heads, c.kv_heads = kv_heads, c.head_dim = head_dim;
  c.mask = mask;
  c.decode_tokens = 4;
  c.ranks = ranks;
  return c;
}

// The layer level's stack of a case at `ranks`.
model::StackConfig layer_case(const Mask& mask, int64_t seq_len, const model::Shape& shape, int ranks) {
  model::StackConfig cfg;
  cfg.shape = shape;
  cfg.pass = model::Pass::Train;
  cfg.attn.seq_len = seq_len;
  cfg.attn.mask = mask;
  cfg.attn.ranks = ranks;
  cfg.seed = 29;
  return cfg;
}
}  // namespace

std::string refusal(const std::string& scheme, const Mask& mask, const std::string& level, int64_t seq_len,
                    const model::Shape& shape, int ranks) {
  const cp::SchemeInfo& info = cp::find(scheme);
  if (level == "attention")
    return cp::check(info, attention_case(info, mask, seq_len, shape.heads, shape.kv_heads, shape.head_dim, ranks));
  return cp::check(info, model::attention_config(layer_case(mask, seq_len, shape, ranks)));
}

std::vector<Row> attention_rows(const std::string& scheme, const Mask& mask, int64_t seq_len, int heads, int kv_heads,
                                int head_dim, comm::Communicator& comm) {
  const cp::SchemeInfo& info = cp::find(scheme);
  Problem p;
  p.cfg = attention_case(info, mask, seq_len, heads, kv_heads, head_dim, comm.world().size);
  const cp::Config& c = p.cfg;
  const std::string why = cp::check(info, c);
  if (!why.empty()) throw std::invalid_argument(why);
  p.Sq = cp::global_q_tokens(c), p.q0 = cp::first_q_position(c);
  p.q = draw(1, size_t(p.Sq) * heads * head_dim, 2.0);
  p.k = draw(2, size_t(seq_len) * kv_heads * head_dim, 2.0);
  p.v = draw(3, size_t(seq_len) * kv_heads * head_dim, 1.0);
  p.dout = draw(4, size_t(p.Sq) * heads * head_dim, 1.0);
  const Outputs ref = reference(p);
  const cp::SchemeInfo& none = cp::find("none");
  auto self = comm::make_mpi_comm(comm::Progress::None, 50, {}, comm::staging_for(kernels::kHostMemory), 1);
  const cp::Shard sh = info.shard(c, comm.world().rank);
  const cp::Shard all = none.shard(
      [&] {
        cp::Config one = c;
        one.ranks = 1;
        return one;
      }(),
      0);
  // Decode queries are on every rank: rank 0's count once.
  const bool q_counted = c.problem == cp::Problem::Train || comm.world().rank == 0;
  const bool train = c.problem == cp::Problem::Train;
  std::vector<Row> rows;
  for (Variant var : kVariants) {
    const bool wire = var == Variant::BF16Wire;
    const bool f32 = var == Variant::F32;
    const Outputs got =
        f32 ? run_variant<float>(info, p, false, comm) : run_variant<kernels::bf16>(info, p, wire, comm);
    const Outputs base =
        f32 ? run_variant<float>(none, p, false, *self) : run_variant<kernels::bf16>(none, p, wire, *self);
    struct Item {
      const char* name;
      Vec Outputs::*field;
      bool on_q;
      int64_t width;
    };
    const int64_t HD = int64_t(heads) * head_dim, KD = int64_t(kv_heads) * head_dim;
    std::vector<Item> items = {{"O", &Outputs::o, true, HD}, {"LSE", &Outputs::lse, true, heads}};
    if (train)
      items.insert(items.end(),
                   {{"dQ", &Outputs::dq, true, HD}, {"dK", &Outputs::dk, false, KD}, {"dV", &Outputs::dv, false, KD}});
    for (const Item& it : items) {
      const std::vector<int64_t>& mine = it.on_q ? sh.q : sh.kv;
      const std::vector<int64_t>& whole = it.on_q ? all.q : all.kv;
      const int64_t first = it.on_q ? p.q0 : 0;
      const ErrorSum e = error_of(got.*it.field, mine, first, it.width, ref.*it.field, it.on_q ? q_counted : true);
      const ErrorSum n = error_of(base.*it.field, whole, first, it.width, ref.*it.field, comm.world().rank == 0);
      rows.push_back({"attention", scheme, mask.name(), to_string(var), it.name, c.ranks, heads, kv_heads, head_dim,
                      seq_len, e.rel_fro(), e.max_rel(), n.rel_fro(), n.max_rel()});
    }
  }
  return rows;
}

namespace {

// A view's values moved onto the bf16 grid in place. A named template, not a generic lambda:
// nvcc refuses a device lambda defined inside one.
template <class V>
void to_bf16_grid(const V& v) {
  using E = typename V::non_const_value_type;
  E* d = v.data();
  kernels::for_each_index(
      "fidelity::bf16_grid", int64_t(v.span()),
      KOKKOS_LAMBDA(const int64_t i) { d[i] = E(float(kernels::bf16(float(d[i])))); });
}

// Every input of a stack (x, dy, each layer's weights) moved onto the bf16 grid, so stacks of
// every precision start from the same values.
template <class T>
void round_inputs(model::Stack<T>& st, int layers) {
  auto grid = [](const auto& v) { to_bf16_grid(v); };
  grid(st.x());
  grid(st.dy());
  for (int l = 0; l < layers; ++l) grid(st.params(l));
  Kokkos::fence();
}

struct LayerOut {
  std::vector<int64_t> rows;
  Vec y, dx;
  std::vector<Vec> dw;  // per layer, whole (summed over the group)
};

template <class T>
LayerOut run_stack(const model::StackConfig& cfg, const cp::SchemeInfo& info, comm::Communicator& comm) {
  model::Stack<T> st(cfg, info, comm);
  round_inputs(st, cfg.shape.layers);
  cp::Context ctx{comm, model::attention_config(cfg)};
  st.forward(ctx);
  st.backward(ctx);
  LayerOut out{st.rows(), to_vec(st.y()), to_vec(st.dx()), {}};
  for (int l = 0; l < cfg.shape.layers; ++l) out.dw.push_back(to_vec(st.grads(l)));
  return out;
}

}  // namespace

std::vector<Row> layer_rows(const std::string& scheme, const Mask& mask, int64_t seq_len, const model::Shape& shape,
                            comm::Communicator& comm) {
  const cp::SchemeInfo& info = cp::find(scheme);
  const model::StackConfig cfg = layer_case(mask, seq_len, shape, comm.world().size);
  const std::string why = cp::check(info, model::attention_config(cfg));
  if (!why.empty()) throw std::invalid_argument(why);
  model::StackConfig one = cfg;
  one.attn.ranks = 1;
  const cp::SchemeInfo& none = cp::find("none");
  auto self = comm::make_mpi_comm(comm::Progress::None, 50, {}, comm::staging_for(kernels::kHostMemory), 1);
  const LayerOut ref = run_stack<double>(one, none, *self);
  const bool root = comm.world().rank == 0;
  const auto params = model::layer_params(shape);
  std::vector<Row> rows;
  for (Variant var : kVariants) {
    model::StackConfig c = cfg, c1 = one;
    c.attn.bf16_dkv = c.bf16_grad_allreduce = var == Variant::BF16Wire;
    c1.attn.bf16_dkv = c1.bf16_grad_allreduce = c.attn.bf16_dkv;
    const bool f32 = var == Variant::F32;
    const LayerOut got = f32 ? run_stack<float>(c, info, comm) : run_stack<kernels::bf16>(c, info, comm);
    const LayerOut base = f32 ? run_stack<float>(c1, none, *self) : run_stack<kernels::bf16>(c1, none, *self);
    auto add = [&](const std::string& tensor, const ErrorSum& e, const ErrorSum& n) {
      rows.push_back({"layer", scheme, mask.name(), to_string(var), tensor, c.attn.ranks, shape.heads, shape.kv_heads,
                      shape.head_dim, seq_len, e.rel_fro(), e.max_rel(), n.rel_fro(), n.max_rel()});
    };
    const int64_t C = shape.hidden;
    add("y", error_of(got.y, got.rows, 0, C, ref.y, true), error_of(base.y, base.rows, 0, C, ref.y, root));
    add("dx", error_of(got.dx, got.rows, 0, C, ref.dx, true), error_of(base.dx, base.rows, 0, C, ref.dx, root));
    const std::vector<int64_t> whole{0};  // a weight gradient: one row, the same on every rank
    for (int l = 0; l < shape.layers; ++l)
      for (const model::Param& pr : params) {
        auto slice = [&](const LayerOut& r) {
          const Vec& v = r.dw[size_t(l)];
          return Vec(v.begin() + pr.offset, v.begin() + pr.offset + pr.size());
        };
        const Vec want = slice(ref);
        add("l" + std::to_string(l) + ".d" + pr.name, error_of(slice(got), whole, 0, pr.size(), want, root),
            error_of(slice(base), whole, 0, pr.size(), want, root));
      }
  }
  return rows;
}

}  // namespace minicp::fidelity
