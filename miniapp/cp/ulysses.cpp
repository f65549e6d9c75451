// Scheme `ulysses` (DeepSpeed-Ulysses): an all-to-all over all P ranks turns the contiguous
// sequence shards into head shards (H/P heads, all S tokens), one local attention runs on
// those, and an all-to-all turns the output back. Beyond the simplest version: K/V heads are
// replicated when kv_heads < P (their gradients summed back), and the head-sharded tensors
// of the forward are kept for the backward. The exchange code is shared with usp.
#include "miniapp/cp/layout.hpp"
#include "miniapp/cp/ulysses_common.hpp"

namespace minicp::cp {
namespace {

template <class T>
class Ulysses final : public Scheme<T> {
 public:
  using A = kernels::acc_t<T>;
  // q[S/P,H,D], k,v[S/P,Hkv,D] (contiguous rows) -> o[S/P,H,D], lse[S/P,H].
  void forward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, View3<T> o, View2<A> lse) override {
    const auto& g = ctx.comm.world();
    engine_.forward(ctx, g, nullptr, positions(ctx), q, k, v, o, lse);
  }
  void backward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<A> lse, CView3<T> dout,
                View3<T> dq, View3<T> dk, View3<T> dv) override {
    const auto& g = ctx.comm.world();
    engine_.backward(ctx, g, nullptr, positions(ctx), q, k, v, o, lse, dout, dq, dk, dv);
  }

 private:
  // After the all-to-all every rank holds all S tokens in order.
  static std::vector<int64_t> positions(const Context& ctx) { return layout::contiguous(ctx.cfg.seq_len, 1, 0); }
  UlyssesEngine<T> engine_;
};

}  // namespace

SchemeInfo ulysses_scheme() {
  SchemeInfo s = make_info<Ulysses>(
      "ulysses", "all-to-all sequence -> heads, local attention, all-to-all back (DeepSpeed-Ulysses)");
  s.refuses = "heads not divisible by ranks; seq_len not divisible by ranks (any kv_heads dividing heads runs)";
  s.check = [](const Config& c) -> std::string {
    std::string why = ulysses_head_check("ulysses", c.heads, c.ranks, "ranks");
    if (why.empty()) why = layout::check(layout::Kind::Contiguous, c.seq_len, c.ranks, "ulysses");
    return why;
  };
  s.shard = [](const Config& c, int r) {
    const auto t = layout::contiguous(c.seq_len, c.ranks, r);
    return Shard{t, t};
  };
  s.workspace = [](const Config& c) {
    return by_precision(c,
                        [&](const Units& u) { return ulysses_workspace(u, c, c.ranks, double(c.seq_len) / c.ranks); });
  };
  // All-to-alls around one local call: every rank attends all S tokens with its H/P heads.
  s.schedule = [](const Config& c, const predict::Topo& t, int, bool backward, size_t elem) {
    const HeadSplit qs = HeadSplit::query(c.heads, c.ranks), ks = HeadSplit::kv(c.heads, c.kv_heads, c.ranks);
    predict::Step local;
    local.attn.push_back(
        {layout::contiguous_spans(c.seq_len, 1, 0), layout::contiguous_spans(c.seq_len, 1, 0), qs.per, ks.per});
    if (backward) local.aux_values = double(c.seq_len) * (qs.per + 2 * ks.per) * c.head_dim;  // zeroing
    return predict::Schedule{ulysses_steps(c, t, c.ranks, 0, double(c.seq_len) / c.ranks, {local}, backward, elem)};
  };
  return s;
}

}  // namespace minicp::cp
