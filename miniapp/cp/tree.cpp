// Scheme `tree`: tree attention for decode. The T query tokens are replicated on every rank
// and the KV cache is sharded contiguously; each rank computes a local (O, LSE), then one
// all-reduce MAX of the LSE and one all-reduce SUM of [w*O | w] combine them in O(log P) steps
// through MPI's reduction tree, instead of passing KV blocks around a ring (P steps).
// Precision (bf16 runs): the local (O, LSE), the max and the weighted sums are fp32 and are
// all-reduced in fp32 (they are partials being merged); o is rounded to bf16 once, at the end.
#include <stdexcept>

#include "miniapp/cp/common.hpp"
#include "miniapp/cp/layout.hpp"

namespace minicp::cp {
namespace {

// o[Tq,H,D], lse[Tq,H] local; m[Tq,H] the global max LSE -> packed[Tq*H*D + Tq*H] = [w*o | w],
// w = exp(lse - m) (0 for an empty local row or an empty global row). All in the accumulator type.
template <class A>
void pack_weighted(CView3<A> o, CView2<A> lse, CView2<A> m, View1<A> packed) {
  const int H = int(o.extent(1)), D = int(o.extent(2));
  const int64_t rows = int64_t(o.extent(0)) * H, nO = rows * D;
  Kokkos::parallel_for(
      "cp::tree::weight", Kokkos::RangePolicy<kernels::Exec, Kokkos::IndexType<int64_t>>(0, rows),
      KOKKOS_LAMBDA(const int64_t idx) {
        const int s = int(idx / H), h = int(idx % H);
        const A l = A(lse(s, h)), mx = A(m(s, h));
        const A w = (l == kernels::neg_inf<A>() || mx == kernels::neg_inf<A>()) ? A(0) : kernels::exp(l - mx);
        for (int d = 0; d < D; ++d) packed(idx * D + d) = w * o(s, h, d);
        packed(nO + idx) = w;
      });
}

// packed = [sum w*o | sum w] over ranks, m[Tq,H] -> o = sum(w*o)/sum(w) (rounded to T once),
// lse = m + log(sum w); rows with m = -inf (no key visible on any rank) give o = 0, lse = -inf.
template <class T>
void unpack_normalised(View1<kernels::acc_t<T>> packed, CView2<kernels::acc_t<T>> m, View3<T> o,
                       View2<kernels::acc_t<T>> lse) {
  using A = kernels::acc_t<T>;
  const int H = int(o.extent(1)), D = int(o.extent(2));
  const int64_t rows = int64_t(o.extent(0)) * H, nO = rows * D;
  Kokkos::parallel_for(
      "cp::tree::normalise", Kokkos::RangePolicy<kernels::Exec, Kokkos::IndexType<int64_t>>(0, rows),
      KOKKOS_LAMBDA(const int64_t idx) {
        const int s = int(idx / H), h = int(idx % H);
        const A mx = A(m(s, h)), wsum = A(packed(nO + idx));
        if (mx == kernels::neg_inf<A>() || !(wsum > A(0))) {
          for (int d = 0; d < D; ++d) o(s, h, d) = T(0);
          lse(s, h) = kernels::neg_inf<A>();
          return;
        }
        const A inv = A(1) / wsum;
        for (int d = 0; d < D; ++d) o(s, h, d) = T(packed(idx * D + d) * inv);
        lse(s, h) = mx + kernels::log(wsum);
      });
}

template <class T>
class Tree final : public Scheme<T> {
 public:
  using A = kernels::acc_t<T>;
  // q[Tq,H,D] (the same on every rank), k,v[S/P,Hkv,D] (contiguous shard) -> o[Tq,H,D],
  // lse[Tq,H], the full result on every rank.
  void forward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, View3<T> o, View2<A> lse) override {
    const auto& g = ctx.comm.world();
    const auto qpos = decode_positions(ctx.cfg);
    const auto kpos = layout::contiguous(ctx.cfg.seq_len, g.size, g.rank);
    ctx.at_step(0);
    bool have = false;
    const AccOut<T> oa(o, "cp::tree::o_acc");  // the local O (o itself for fp32, fp64)
    if (computes(ctx)) {
      if (fully_masked(ctx.cfg, qpos, kpos)) {
        ++ctx.stats.blocks_skipped;
      } else {
        const auto mask = make_mask(ctx.cfg, qpos, kpos);
        timed_compute(ctx, [&] { return kernels::attention_fwd<T>(q, k, v, mask, oa.acc(), lse, ctx.cfg.attn); });
        have = true;
      }
    }
    if (!have) {  // nothing visible to any query on this shard (or compute skipped)
      Kokkos::deep_copy(oa.acc(), A(0));
      Kokkos::deep_copy(lse, kernels::neg_inf<A>());
    }

    const size_t Tq = o.extent(0), H = o.extent(1), D = o.extent(2);
    View2<A> m(Kokkos::view_alloc("cp::tree::lse_max", Kokkos::WithoutInitializing), Tq, H);
    View1<A> packed(Kokkos::view_alloc("cp::tree::packed", Kokkos::WithoutInitializing), Tq * H * D + Tq * H);
    timed_aux(ctx, [&] { Kokkos::deep_copy(m, lse); });
    if (communicates(ctx)) timed_allreduce<A>(ctx, m.data(), Tq * H, comm::ReduceOp::Max);
    timed_aux(ctx, [&] { pack_weighted<A>(oa.acc(), lse, m, packed); });
    if (communicates(ctx)) timed_allreduce<A>(ctx, packed.data(), packed.span(), comm::ReduceOp::Sum);
    timed_aux(ctx, [&] { unpack_normalised<T>(packed, m, o, lse); });
  }

  void backward(Context&, CView3<T>, CView3<T>, CView3<T>, CView3<T>, CView2<A>, CView3<T>, View3<T>, View3<T>,
                View3<T>) override {
    throw std::logic_error("tree is decode only: it has no backward pass");
  }
};

}  // namespace

SchemeInfo tree_scheme() {
  SchemeInfo s = make_info<Tree>(
      "tree",
      "decode: queries replicated, KV cache sharded; local (O, LSE) combined by all-reduce max/sum, O(log P) steps");
  s.problems = {Problem::Decode};
  s.refuses = "seq_len (the cache) not divisible by ranks; the train pass (decode only)";
  s.check = [](const Config& c) { return layout::check(layout::Kind::Contiguous, c.seq_len, c.ranks, "tree"); };
  s.shard = [](const Config& c, int r) {
    return Shard{decode_positions(c), layout::contiguous(c.seq_len, c.ranks, r)};
  };
  // One local call on the cache shard, then the two all-reduces (MAX of the LSE, SUM of [w*O | w]).
  s.schedule = [](const Config& c, const predict::Topo& t, int r, bool, size_t elem) {
    predict::Step local, combine;
    const double rows = double(c.decode_tokens) * c.heads;
    local.attn.push_back(
        {{{c.seq_len, c.decode_tokens, 1}}, layout::contiguous_spans(c.seq_len, c.ranks, r), c.heads, c.kv_heads});
    if (c.ranks > 1) {  // both in acc_t
      const bool inter = t.spans_nodes(0, c.ranks, 1);
      const size_t acc = kernels::acc_size(elem);
      combine.exposed = {{comm::EventKind::AllReduce, int64_t(rows * acc), c.ranks, inter},
                         {comm::EventKind::AllReduce, int64_t(rows * (c.head_dim + 1.0) * acc), c.ranks, inter}};
    }
    combine.aux_values = 2 * rows * (c.head_dim + 1.0);
    return predict::Schedule{{local, combine}};
  };
  s.workspace = [](const Config& c) {  // the max LSE and the packed [w*O | w], per call, and a bf16 run's local O
    return by_precision(c, [&](const Units& u) {
      const double rows = double(c.decode_tokens) * c.heads;
      return Workspace{u.acc * rows * (c.head_dim + 2.0) + output_accumulators(u, c, rows / c.heads, 0), 0};
    });
  };
  return s;
}

}  // namespace minicp::cp
