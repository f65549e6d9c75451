// Scheme `none`: one rank holds the whole sequence and calls the kernels directly. It is
// the reference every other scheme is checked against.
#include "miniapp/cp/common.hpp"
#include "miniapp/cp/layout.hpp"

namespace minicp::cp {
namespace {

// The kernels' results are in acc_t<T> (fp32 for bf16), rounded once into o, dq, dk, dv.
template <class T>
class None final : public Scheme<T> {
 public:
  using A = kernels::acc_t<T>;
  // train: q, k, v[S,.,D]; decode: q[T,H,D] at positions S.. against the cache k, v[S,Hkv,D].
  void forward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, View3<T> o, View2<A> lse) override {
    if (!computes(ctx)) return;
    const auto kpos = layout::contiguous(ctx.cfg.seq_len, 1, 0);
    const auto qpos = ctx.cfg.problem == Problem::Decode ? decode_positions(ctx.cfg) : kpos;
    const auto mask = make_mask(ctx.cfg, qpos, kpos);
    const AccOut<T> oa(o, "none_o_acc");
    timed_compute(ctx, [&] { return kernels::attention_fwd<T>(q, k, v, mask, oa.acc(), lse, ctx.cfg.attn); });
    oa.store(ctx);
  }
  void backward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<A> lse, CView3<T> dout,
                View3<T> dq, View3<T> dk, View3<T> dv) override {
    const AccOut<T> dqa(dq, "none_dq_acc"), dka(dk, "none_dk_acc"), dva(dv, "none_dv_acc");
    Kokkos::deep_copy(dqa.acc(), A(0));
    Kokkos::deep_copy(dka.acc(), A(0));
    Kokkos::deep_copy(dva.acc(), A(0));
    if (computes(ctx)) {
      const auto pos = layout::contiguous(ctx.cfg.seq_len, 1, 0);
      const auto mask = make_mask(ctx.cfg, pos, pos);
      timed_compute(ctx, [&] {
        return kernels::attention_bwd<T>(q, k, v, o, lse, dout, mask, dqa.acc(), dka.acc(), dva.acc(), ctx.cfg.attn);
      });
    }
    for (const AccOut<T>* x : {&dqa, &dka, &dva}) x->store(ctx);
  }
};

}  // namespace

SchemeInfo none_scheme() {
  SchemeInfo s = make_info<None>("none", "single rank, no communication (the reference); train and decode");
  s.problems = {Problem::Train, Problem::Decode};
  s.refuses = "ranks > 1";
  s.check = [](const Config& c) -> std::string {
    return c.ranks == 1 ? "" : "none needs ranks == 1 (got " + std::to_string(c.ranks) + ")";
  };
  s.shard = [](const Config& c, int r) {
    const auto t = layout::contiguous(c.seq_len, 1, r);
    return Shard{c.problem == Problem::Decode ? decode_positions(c) : t, t};
  };
  s.workspace = [](const Config& c) {  // the fp32 accumulators of a bf16 run's outputs
    return by_precision(c, [&](const Units& u) {
      return Workspace{output_accumulators(u, c, double(global_q_tokens(c)), double(c.seq_len)), 0};
    });
  };
  s.schedule = [](const Config& c, const predict::Topo&, int, bool, size_t) {
    const predict::Spans all = layout::contiguous_spans(c.seq_len, 1, 0);
    const predict::Spans q = c.problem == Problem::Decode ? predict::Spans{{c.seq_len, c.decode_tokens, 1}} : all;
    predict::Step st;
    st.attn.push_back({q, all, c.heads, c.kv_heads});
    return predict::Schedule{{st}};
  };
  return s;
}

}  // namespace minicp::cp
