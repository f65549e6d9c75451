// Scheme `ulysses` (DeepSpeed-Ulysses): an all-to-all over all P ranks turns the contiguous
// sequence shards into head shards (H/P heads, all S tokens), one local attention runs on
// those, and an all-to-all turns the output back. Beyond the simplest version: K/V heads are
// replicated when kv_heads < P (their gradients summed back), and the head-sharded tensors
// of the forward are kept for the backward. The exchange code is shared with usp. Its
// sequence shard is a choice: a dispatch that gives every rank as many tokens replaces the
// contiguous one (the all-to-alls exchange equal blocks), and the local attention then runs on
// the ranks' tokens in rank order.
#include "miniapp/cp/layout.hpp"
#include "miniapp/cp/ulysses_common.hpp"

namespace minicp::cp {
namespace {

// After the all-to-all every rank holds all S tokens: rank 0's, then rank 1's ... (in order
// without a dispatch).
std::vector<int64_t> gathered_positions(const Config& c) {
  if (!c.tokens) return layout::contiguous(c.seq_len, 1, 0);
  std::vector<int64_t> out;
  for (const auto& t : *c.tokens) out.insert(out.end(), t.begin(), t.end());
  return out;
}

template <class T>
class Ulysses final : public Scheme<T> {
 public:
  using A = kernels::acc_t<T>;
  // q[S/P,H,D], k,v[S/P,Hkv,D] (contiguous rows, or the dispatch's) -> o[S/P,H,D], lse[S/P,H].
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
  static std::vector<int64_t> positions(const Context& ctx) { return gathered_positions(ctx.cfg); }
  UlyssesEngine<T> engine_;
};

}  // namespace

SchemeInfo ulysses_scheme() {
  SchemeInfo s = make_info<Ulysses>(
      "ulysses", "all-to-all sequence -> heads, local attention, all-to-all back (DeepSpeed-Ulysses)");
  s.takes_dispatch = true;
  s.refuses =
      "heads not divisible by ranks; seq_len not divisible by ranks; a dispatch of unequal token counts (any kv_heads "
      "dividing heads runs)";
  s.check = [](const Config& c) -> std::string {
    std::string why = ulysses_head_check("ulysses", c.heads, c.ranks, "ranks");
    if (why.empty() && c.tokens) why = equal_tokens(*c.tokens, "ulysses", c.dispatch);
    if (why.empty() && !c.tokens) why = layout::check(layout::Kind::Contiguous, c.seq_len, c.ranks, "ulysses");
    return why;
  };
  s.shard = [](const Config& c, int r) {
    const auto t = shard_tokens(layout::Kind::Contiguous, c, c.ranks, r);
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
    const predict::Spans all =
        c.tokens ? layout::spans_of_positions(gathered_positions(c)) : layout::contiguous_spans(c.seq_len, 1, 0);
    local.attn.push_back({all, all, qs.per, ks.per});
    if (backward) local.aux_values = double(c.seq_len) * (qs.per + 2 * ks.per) * c.head_dim;  // zeroing
    return predict::Schedule{ulysses_steps(c, t, c.ranks, 0, double(c.seq_len) / c.ranks, {local}, backward, elem)};
  };
  return s;
}

}  // namespace minicp::cp
