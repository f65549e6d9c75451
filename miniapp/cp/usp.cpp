// Scheme `usp` (Unified Sequence Parallel): ranks form a grid of R ring groups x U Ulysses
// ranks (world rank = ring_index*U + ulysses_index). A Ulysses all-to-all inside each group
// gives every member its H/U heads for the whole zigzag shard of its ring index; ring
// attention then runs across the R groups, and the all-to-all goes back. U = P gives plain
// Ulysses (local attention), U = 1 a zigzag ring. Its sequence shard is a choice: a dispatch
// that gives every rank as many tokens replaces the zigzag one (the all-to-alls exchange equal
// blocks); a ring block is then the dispatch's tokens of one group's members, in member order.
// Group size U: the ulysses setting when set (it must divide P); otherwise the largest divisor U of P
// with U <= P/2, so the ring keeps >= 2 ranks, that meets the head rules (heads % U == 0,
// and kv_heads % U == 0 or U % kv_heads == 0); U = 1 when P == 1 or no divisor qualifies.
#include <optional>

#include "miniapp/cp/layout.hpp"
#include "miniapp/cp/ulysses_common.hpp"

namespace minicp::cp {
namespace {

// World rank w's tokens: the dispatch's, else its zigzag shard of the ring index.
std::vector<int64_t> usp_tokens(const Config& c, int R, int U, int w) {
  return c.tokens ? (*c.tokens)[size_t(w)] : layout::usp(c.seq_len, R, U, w);
}

template <class T>
class Usp final : public Scheme<T> {
 public:
  using A = kernels::acc_t<T>;
  // q[S/P,H,D], k,v[S/P,Hkv,D] (layout::usp rows, or the dispatch's) -> o[S/P,H,D], lse[S/P,H].
  void forward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, View3<T> o, View2<A> lse) override {
    setup(ctx);
    engine_.forward(ctx, *ulysses_, &*ring_, pos_, q, k, v, o, lse);
  }
  void backward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<A> lse, CView3<T> dout,
                View3<T> dq, View3<T> dk, View3<T> dv) override {
    setup(ctx);
    engine_.backward(ctx, *ulysses_, &*ring_, pos_, q, k, v, o, lse, dout, dq, dk, dv);
  }

 private:
  // Splits the world into the two group axes once per object (collective: every rank
  // reaches it on its first call) and lists the positions of the head-sharded rows: the
  // shards of the Ulysses group's members in member order, as the all-to-all delivers them.
  void setup(Context& ctx) {
    if (ulysses_) return;
    Config c = ctx.cfg;
    c.ranks = ctx.comm.world().size;
    const int U = usp_ulysses_size(c), R = c.ranks / U;
    ulysses_ = ctx.comm.split_contiguous(U, "ulysses");
    ring_ = ctx.comm.split_strided(R, "ring");
    pos_.clear();
    // The group's members are the world's ranks first .. first+U-1 (split_contiguous), by
    // their rank in this communicator's world (the CP group), not in MPI_COMM_WORLD.
    const int first = ctx.comm.world().rank / U * U;
    for (int w = first; w < first + U; ++w) {
      const auto part = usp_tokens(c, R, U, w);
      pos_.insert(pos_.end(), part.begin(), part.end());
    }
  }
  std::optional<comm::Group> ulysses_, ring_;
  std::vector<int64_t> pos_;
  UlyssesEngine<T> engine_;
};

}  // namespace

SchemeInfo usp_scheme() {
  SchemeInfo s = make_info<Usp>("usp", "Ulysses all-to-all inside groups x zigzag ring across groups (2D)");
  s.settings = {{"ulysses",
                 "usp: Ulysses group size U (ranks); 0 = the largest divisor of ranks <= ranks/2 that divides heads", 0,
                 0, [](const Config& c, const comm::Topology&) { return usp_ulysses_size(c); }}};
  s.ring_family = true;
  s.takes_dispatch = true;
  s.refuses =
      "ulysses not dividing ranks; heads not divisible by ulysses; seq_len not divisible by 2*ranks (its own layout); "
      "a "
      "dispatch of unequal token counts";
  s.check = [](const Config& c) -> std::string {
    const int U = c.setting("ulysses");
    if (U > 0 && c.ranks % U != 0)
      return "usp needs ulysses (" + std::to_string(U) + ") dividing ranks (" + std::to_string(c.ranks) + ")";
    std::string why = c.tokens ? equal_tokens(*c.tokens, "usp", c.dispatch)
                               : layout::check(layout::Kind::Zigzag, c.seq_len, c.ranks, "usp");
    if (why.empty()) why = ulysses_head_check("usp", c.heads, usp_ulysses_size(c), "ulysses");
    return why;
  };
  s.shard = [](const Config& c, int r) {
    const int U = usp_ulysses_size(c);
    const auto t = usp_tokens(c, c.ranks / U, U, r);
    return Shard{t, t};
  };
  // The Ulysses engine's buffers, and the ring's over the R groups on the head-sharded rows
  // (none when R = 1: attention is local). The ring's scratch is named by its group, which
  // every object splits anew (setup()): each object holds its own, shared by no other layer.
  s.workspace = [](const Config& c) {
    const int U = usp_ulysses_size(c), R = c.ranks / U;
    const double n = double(c.seq_len) / c.ranks, N = U * n;  // head-sharded rows
    const HeadSplit ks = HeadSplit::kv(c.heads, c.kv_heads, U);
    return by_precision(c, [&](const Units& un) {
      const Workspace u = ulysses_workspace(un, c, U, n);
      if (R == 1) return u;
      const Workspace r = ring_workspace(un, N, N, c.heads / U, ks.per, c.head_dim, R);
      return Workspace{u.shared, u.per_object + r.shared + r.per_object};
    });
  };
  // The Ulysses exchange inside the group of U consecutive ranks, a ring over the R groups on
  // the head-sharded rows (ring member i holds the shards of world ranks i*U .. i*U+U-1).
  s.schedule = [](const Config& c, const predict::Topo& t, int r, bool backward, size_t elem) {
    const int U = usp_ulysses_size(c), R = c.ranks / U, u = r % U;
    const HeadSplit qs = HeadSplit::query(c.heads, U), ks = HeadSplit::kv(c.heads, c.kv_heads, U);
    const auto table = c.tokens ? dispatch_spans(c.tokens) : nullptr;  // the dispatch's rows per rank
    auto rows = [&](int i) {
      predict::Spans out;
      for (int w = i * U; w < i * U + U; ++w) {
        const predict::Spans part = table ? (*table)[size_t(w)] : layout::usp_spans(c.seq_len, R, U, w);
        out.insert(out.end(), part.begin(), part.end());
      }
      return out;
    };
    auto ring = ring_steps(
        c, t, R, r / U, [&](int i) { return i * U + u; }, rows, qs.per, ks.per, backward, elem);
    return predict::Schedule{ulysses_steps(c, t, U, r - u, double(c.seq_len) / c.ranks, ring, backward, elem)};
  };
  return s;
}

}  // namespace minicp::cp
