// Tiles of one attention call, counted in closed form over the call's spans (see predict.hpp's
// count_tiles): what the tiled kernel's classify() (kernels/attention_tiled.cpp) decides for
// every pair of a query tile and a key tile, without listing the tiles, so that the cost does
// not grow with the sequence.
//
// The tiles of b consecutive local rows are regular inside a span: a "run" of n tiles whose
// lowest positions are p, p + s, p + 2s ... and whose highest are w above. Only a tile that
// straddles two spans (and the last, short one) is irregular: a run of one. For a pair of runs
// every condition of classify() is linear in the two tile indices once the documents (position
// / doc_len) of one side are affine in its index, and the pairs meeting linear bounds are
// counted with floor sums (sum_i floor((a i + b) / m) in O(log)). A run whose documents are
// not affine is cut into pieces that are: by tile index modulo doc_len / gcd(s, doc_len)
// (positions then advance by a multiple of doc_len), or by document (each document's tiles),
// where the documents repeat every lcm(steps, doc_len) / doc_len of them once both runs cover
// them whole; the cheaper cut is taken. The cost grows with the number of spans and with the
// tiles' step in positions (tile rows x span stride), not with the sequence or doc_len.
// Positions are non-negative (documents are position / doc_len). Documents of several lengths
// are counted per query tile instead (count_listed_documents).
#include <algorithm>
#include <array>
#include <unordered_map>
#include <utility>
#include <vector>

#include "miniapp/predict/predict.hpp"

namespace minicp::predict {

namespace {

// 128 bits: pair counts reach (2^62)^2 and positions minus windows go below -2^63.
using i128 = __int128;

i128 fdiv(i128 a, i128 b) {  // floor(a / b), b > 0
  const i128 q = a / b;
  return q * b > a ? q - 1 : q;
}
i128 cdiv(i128 a, i128 b) { return -fdiv(-a, b); }  // ceil(a / b), b > 0
i128 gcd(i128 a, i128 b) {
  while (b != 0) a %= b, std::swap(a, b);
  return a;
}

// sum_{i < n} floor((a i + b) / m), m > 0: the lattice points under a line, by Euclid's steps.
i128 floor_sum(i128 n, i128 m, i128 a, i128 b) {
  if (n <= 0) return 0;
  i128 s = 0;
  i128 q = fdiv(a, m);
  s += q * (n * (n - 1) / 2), a -= q * m;
  q = fdiv(b, m);
  s += q * n, b -= q * m;
  while (true) {  // 0 <= a, b < m here
    const i128 y = a * n + b;
    if (y < m) break;
    n = y / m, b = y % m;
    std::swap(m, a);
    s += (a / m) * (n * (n - 1) / 2) + (b / m) * n;
    a %= m, b %= m;
  }
  return s;
}

// A line a t + b over a tile index t.
struct Lin {
  i128 a = 0, b = 0;
  i128 at(i128 t) const { return a * t + b; }
  Lin operator+(i128 c) const { return {a, b + c}; }
  Lin operator-(i128 c) const { return {a, b - c}; }
};

// A few bounds on s*j (j: the inner tile's index), as lines in the outer tile's t; of bounds
// with one slope only the tightest is kept.
struct Bounds {
  std::array<Lin, 6> v;
  int n = 0;
  void add(Lin f, bool lower) {
    for (int i = 0; i < n; ++i)
      if (v[size_t(i)].a == f.a) {
        Lin& g = v[size_t(i)];
        g.b = lower ? std::max(g.b, f.b) : std::min(g.b, f.b);
        return;
      }
    v[size_t(n++)] = f;
  }
};

// t where h(t) >= 0 starts or stops holding (h.a != 0).
i128 sign_change(Lin h) { return h.a > 0 ? cdiv(-h.b, h.a) : fdiv(h.b, -h.a) + 1; }

// [t0, t1] narrowed to where h(t) >= 0.
void keep_nonneg(Lin h, i128& t0, i128& t1) {
  if (h.a == 0) {
    if (h.b < 0) t1 = t0 - 1;
  } else if (h.a > 0) {
    t0 = std::max(t0, cdiv(-h.b, h.a));
  } else {
    t1 = std::min(t1, fdiv(h.b, -h.a));
  }
}

// sum over t < nt of #{j < nj : lo(t) <= s j <= hi(t) for every lo in `lo`, hi in `hi`}.
// Between the points where two bounds cross, the tightest bounds are fixed lines U and D, and
// the count is floor(U/s) - ceil(D/s) + 1 where U >= D (0 where U < D).
i128 count_lattice(i128 nt, i128 s, i128 nj, Bounds lo, Bounds hi) {
  if (nt <= 0 || nj <= 0) return 0;
  if (s == 0) {  // every j at 0: all of them or none
    i128 t0 = 0, t1 = nt - 1;
    for (int i = 0; i < lo.n; ++i) keep_nonneg({-lo.v[size_t(i)].a, -lo.v[size_t(i)].b}, t0, t1);
    for (int i = 0; i < hi.n; ++i) keep_nonneg(hi.v[size_t(i)], t0, t1);
    return t1 >= t0 ? nj * (t1 - t0 + 1) : 0;
  }
  lo.add({0, 0}, true), hi.add({0, s * (nj - 1)}, false);
  std::array<Lin, 12> all;
  int na = 0;
  for (int i = 0; i < lo.n; ++i) all[size_t(na++)] = lo.v[size_t(i)];
  for (int i = 0; i < hi.n; ++i) all[size_t(na++)] = hi.v[size_t(i)];
  std::array<i128, 2 + 2 * 66> cut;
  int nc = 0;
  cut[size_t(nc++)] = 0, cut[size_t(nc++)] = nt;
  for (int i = 0; i < na; ++i)
    for (int k = i + 1; k < na; ++k) {
      const Lin &f = all[size_t(i)], &g = all[size_t(k)];
      if (f.a == g.a) continue;
      // where f >= g and where g >= f change (they differ where f = g at a whole t)
      for (const i128 t : {sign_change({f.a - g.a, f.b - g.b}), sign_change({g.a - f.a, g.b - f.b})})
        if (t > 0 && t < nt) cut[size_t(nc++)] = t;
    }
  std::sort(cut.begin(), cut.begin() + nc);
  nc = int(std::unique(cut.begin(), cut.begin() + nc) - cut.begin());
  i128 total = 0;
  for (int c = 0; c + 1 < nc; ++c) {
    const i128 t0 = cut[size_t(c)], len = cut[size_t(c) + 1] - t0;
    Lin U = hi.v[0], D = lo.v[0];
    for (int i = 1; i < hi.n; ++i)
      if (hi.v[size_t(i)].at(t0) < U.at(t0)) U = hi.v[size_t(i)];
    for (int i = 1; i < lo.n; ++i)
      if (lo.v[size_t(i)].at(t0) > D.at(t0)) D = lo.v[size_t(i)];
    if (U.at(t0) < D.at(t0)) continue;
    total += floor_sum(len, s, U.a, U.at(t0)) + floor_sum(len, s, -D.a, -D.at(t0)) + len;
  }
  return total;
}

// Tiles t < n with lowest position p + s t, highest w above, `rows` rows each.
struct Run {
  i128 n = 0, p = 0, s = 0, w = 0, rows = 0;
};
// Documents of a run's tiles affine in t: doc(lowest) = d0 + k t, doc(highest) = d1 + k t.
struct Docs {
  i128 d0 = 0, d1 = 0, k = 0;
};
struct Mask {
  bool causal = false;
  i128 W = 0, L = 0;  // window, doc_len (0: none)
};
// Pairs not skipped, and of them the fully visible.
struct Pairs {
  i128 seen = 0, full = 0;
  Pairs& operator+=(const Pairs& o) {
    seen += o.seen, full += o.full;
    return *this;
  }
  Pairs operator*(i128 c) const { return {seen * c, full * c}; }
};

// The runs of tiles of b consecutive rows of `rows` (tile_bounds' tiles, in its order).
void tile_runs(const Spans& rows, int b, std::vector<Run>& out) {
  out.clear();
  i128 lo = 0, hi = 0, open = 0;  // the tile being filled across spans
  for (const Span& sp : rows) {
    if (sp.count <= 0) continue;
    const i128 n = sp.count, st = sp.stride;
    auto pos = [&](i128 i) { return i128(sp.start) + i * st; };
    i128 i = 0;
    if (open > 0) {
      i = std::min<i128>(b - open, n);
      lo = std::min({lo, pos(0), pos(i - 1)}), hi = std::max({hi, pos(0), pos(i - 1)});
      open += i;
      if (open == b) out.push_back({1, lo, 0, hi - lo, open}), open = 0;
    }
    if (const i128 whole = (n - i) / b; whole > 0) {
      const i128 step = b * (st < 0 ? -st : st), first = st < 0 ? pos(i + whole * b - 1) : pos(i);
      out.push_back({whole, first, whole > 1 ? step : 0, (b - 1) * (st < 0 ? -st : st), b});
      i += whole * b;
    }
    if (i < n && open == 0) lo = std::min(pos(i), pos(n - 1)), hi = std::max(pos(i), pos(n - 1)), open = n - i;
  }
  if (open > 0) out.push_back({1, lo, 0, hi - lo, open});
}

// The bounds classify() puts on an inner run's tile index j against tile t of an outer run whose
// documents are affine (od), for the pair to be seen and to be full: each condition is a bound
// on the inner tile's lowest (p + s j) or highest (p + s j + w) position.
struct Conditions {
  Bounds seen_lo, seen_hi, full_lo, full_hi;
  bool full_possible = true;
};
Conditions conditions(const Run& o, const Docs& od, const Run& in, bool outer_is_q, const Mask& m) {
  const Lin omin{o.s, o.p}, omax = omin + o.w, Ld0{m.L * od.k, m.L * od.d0}, Ld1{m.L * od.k, m.L * od.d1};
  const bool causal = m.causal || m.W > 0;
  Conditions c;
  // inner lowest / highest position <= or >= f(t), as bounds on s j
  auto bound = [&](Bounds& b, Lin f, bool highest, bool lower) { b.add(f - in.p - (highest ? in.w : 0), lower); };
  if (outer_is_q) {  // kmin <= qmax; kmax > qmin - W; full: kmax <= qmin, kmin > qmax - W
    if (causal) bound(c.seen_hi, omax, false, false), bound(c.full_hi, omin, true, false);
    if (m.W > 0) bound(c.seen_lo, omin - (m.W - 1), true, true), bound(c.full_lo, omax - (m.W - 1), false, true);
  } else {  // the same read as bounds on the query tile
    if (causal) bound(c.seen_lo, omin, true, true), bound(c.full_lo, omax, false, true);
    if (m.W > 0) bound(c.seen_hi, omax + (m.W - 1), false, false), bound(c.full_hi, omin + (m.W - 1), true, false);
  }
  if (m.L > 0) {
    // Seen: the document ranges meet. Full: one document for both tiles.
    bound(c.seen_lo, Ld0, true, true), bound(c.seen_hi, Ld1 + (m.L - 1), false, false);
    c.full_possible = od.d0 == od.d1;
    bound(c.full_lo, Ld0, false, true), bound(c.full_hi, Ld0 + (m.L - 1), true, false);
  }
  return c;
}

// Pairs of an outer run with affine documents against an inner run.
Pairs count_affine(const Run& o, const Docs& od, const Run& in, bool outer_is_q, const Mask& m) {
  const Conditions c = conditions(o, od, in, outer_is_q, m);
  Pairs p;
  p.seen = count_lattice(o.n, in.s, in.n, c.seen_lo, c.seen_hi);
  p.full = c.full_possible ? count_lattice(o.n, in.s, in.n, c.full_lo, c.full_hi) : 0;
  return p;
}

i128 doc_of(i128 p, i128 L) { return fdiv(p, L); }

// The run's documents when they are affine in t: all in one document, or a step that is a
// multiple of doc_len.
bool docs_affine(const Run& r, i128 L, Docs& d) {
  d = {doc_of(r.p, L), doc_of(r.p + r.w, L), 0};
  if (r.n == 1) return true;
  const i128 last = r.p + r.s * (r.n - 1);
  if (doc_of(last, L) == d.d0 && doc_of(last + r.w, L) == d.d1) return true;
  if (r.s % L != 0) return false;
  d.k = r.s / L;
  return true;
}

// Cut 1: the tiles t = r (mod pi), pi = doc_len / gcd(s, doc_len): each class advances by
// lcm(s, doc_len), a whole number of documents.
i128 residue_cost(const Run& x, i128 L) { return std::min(x.n, L / gcd(x.s, L)); }
Pairs by_residues(const Run& x, bool x_is_q, const Run& y, const Mask& m) {
  const i128 pi = m.L / gcd(x.s, m.L);
  Pairs p;
  for (i128 r = 0; r < std::min(pi, x.n); ++r) {
    const i128 n = (x.n - 1 - r) / pi + 1;
    const Run c{n, x.p + x.s * r, n > 1 ? x.s * pi : 0, x.w, x.rows};
    p += count_affine(c, {doc_of(c.p, m.L), doc_of(c.p + c.w, m.L), c.s / m.L}, y, x_is_q, m);
  }
  return p;
}

// Cut 2: by document. The tiles of x whose lowest position lies in document d are at most two
// runs of one document pair each (their highest positions fall in at most two documents).
Pairs in_document(const Run& x, bool x_is_q, i128 d, const Run& y, const Mask& m) {
  const i128 L = m.L, lo = L * d;
  i128 a = std::max<i128>(0, cdiv(lo - x.p, x.s));
  const i128 b = std::min(x.n - 1, fdiv(lo + L - 1 - x.p, x.s));
  Pairs p;
  while (a <= b) {
    const i128 e = doc_of(x.p + x.s * a + x.w, L);
    const i128 last = std::min(b, fdiv(L * e + L - 1 - x.w - x.p, x.s));
    p += count_affine({last - a + 1, x.p + x.s * a, x.s, x.w, x.rows}, {d, e, 0}, y, x_is_q, m);
    a = last + 1;
  }
  return p;
}

// The documents of x's tiles that can meet y's (all: [d0, d1]), and those where neither run
// is cut short, [e0, e1]: y's tiles that can meet x's of document d lie in positions
// [L d - y.w, L d + 2L + x.w), and there the counts repeat every `period` documents (the
// positions shift by a multiple of both steps and of doc_len).
struct DocPlan {
  i128 d0 = 0, d1 = -1, e0 = 0, e1 = -1, period = 1;
  i128 cost() const {
    const i128 all = std::max<i128>(0, d1 - d0 + 1), inner = std::max<i128>(0, e1 - e0 + 1);
    return all - inner + std::min(period, inner);
  }
};
DocPlan doc_plan(const Run& x, const Run& y, i128 L) {
  DocPlan dp;
  const i128 y0 = doc_of(y.p, L), y1 = doc_of(y.p + y.s * (y.n - 1) + y.w, L);
  dp.d0 = std::max(doc_of(x.p, L), cdiv(L * y0 - L + 1 - x.w, L));
  dp.d1 = std::min(doc_of(x.p + x.s * (x.n - 1), L), y1);
  dp.e0 = std::max({dp.d0, cdiv(x.p - x.s + 1, L), cdiv(y.p + y.w - y.s + 1, L)});
  dp.e1 = std::min({dp.d1, fdiv(x.p + x.s * x.n - L, L), fdiv(y.p + y.s * y.n - 2 * L - x.w, L)});
  if (dp.e0 > dp.e1) dp.e0 = dp.d1 + 1, dp.e1 = dp.d1;  // none: all counted one by one
  const i128 l = x.s / gcd(x.s, y.s) * y.s;
  dp.period = l / gcd(l, L);
  return dp;
}
Pairs by_documents(const Run& x, bool x_is_q, const Run& y, const Mask& m) {
  const DocPlan dp = doc_plan(x, y, m.L);
  Pairs p;
  for (i128 d = dp.d0; d <= dp.d1; ++d) {
    if (d == dp.e0) d = dp.e1 + 1;  // the repeating stretch: below
    if (d <= dp.d1) p += in_document(x, x_is_q, d, y, m);
  }
  const i128 n = dp.e1 - dp.e0 + 1;
  for (i128 r = 0; r < std::min(dp.period, n); ++r)
    p += in_document(x, x_is_q, dp.e0 + r, y, m) * ((n - 1 - r) / dp.period + 1);
  return p;
}

// Every pair of two short runs as classify() sees it: cheaper than the closed forms below a
// few hundred pairs (a small call's tiles cost what they did before).
Pairs one_by_one(const Run& q, const Run& k, const Mask& m) {
  const bool causal = m.causal || m.W > 0;
  auto doc = [&](i128 p) { return m.L > 0 ? int64_t(p) / int64_t(m.L) : 0; };  // p >= 0
  Pairs out;
  for (i128 i = 0; i < q.n; ++i) {
    const i128 qa = q.p + q.s * i, qb = qa + q.w;
    const int64_t qd0 = doc(qa), qd1 = doc(qb);
    for (i128 j = 0; j < k.n; ++j) {
      const i128 ka = k.p + k.s * j, kb = ka + k.w;
      const int64_t kd0 = doc(ka), kd1 = doc(kb);
      if ((causal && ka > qb) || (m.W > 0 && kb <= qa - m.W) || kd1 < qd0 || kd0 > qd1) continue;
      ++out.seen;
      out.full += (!causal || kb <= qa) && (m.W == 0 || ka > qb - m.W) && qd0 == qd1 && kd0 == kd1 && qd0 == kd0;
    }
  }
  return out;
}

// Pairs of a query run and a key run: directly where one side's documents are affine, else by
// the cheapest cut (`cut` forces one, and the closed forms even for short runs).
Pairs count_runs(const Run& q, const Run& k, const Mask& m, TileCut cut) {
  Docs dq, dk;
  const bool q_affine = m.L == 0 || docs_affine(q, m.L, dq), k_affine = !q_affine && docs_affine(k, m.L, dk);
  i128 cost = 1;  // in runs counted in closed form
  if (!q_affine && !k_affine && cut == TileCut::Cheapest) {
    // cut 2 counts up to two runs a document
    const std::array<std::pair<i128, TileCut>, 4> ways{{{residue_cost(q, m.L), TileCut::QueryResidues},
                                                        {residue_cost(k, m.L), TileCut::KeyResidues},
                                                        {2 * doc_plan(q, k, m.L).cost(), TileCut::QueryDocuments},
                                                        {2 * doc_plan(k, q, m.L).cost(), TileCut::KeyDocuments}}};
    const auto best = std::min_element(ways.begin(), ways.end(), [](auto& a, auto& b) { return a.first < b.first; });
    cost = best->first, cut = best->second;
  }
  if (cut == TileCut::Cheapest && q.n * k.n <= 64 * cost) return one_by_one(q, k, m);
  if (q_affine) return count_affine(q, dq, k, true, m);
  if (k_affine) return count_affine(k, dk, q, false, m);
  switch (cut) {
    case TileCut::QueryResidues: return by_residues(q, true, k, m);
    case TileCut::KeyResidues: return by_residues(k, false, q, m);
    case TileCut::QueryDocuments: return by_documents(q, true, k, m);
    default: break;
  }
  return by_documents(k, false, q, m);
}

// The highest position of a run's tiles.
i128 highest(const Run& r) { return r.p + r.s * (r.n - 1) + r.w; }

// Documents of several lengths (cp::Mask::doc_starts), causal. What classify() needs of a query
// tile: its positions and the starts of its first document, the one after it, and the one
// after its last; found once per query tile, not once per key run it meets.
struct QueryTileDocs {
  i128 qmin = 0, qmax = 0, first = 0, after_first = 0, after_last = 0;
  bool one_doc = false;
};
std::vector<QueryTileDocs> query_tile_docs(const Run& q, const cp::Mask& mask) {
  const std::vector<int64_t>& starts = mask.doc_starts();
  const i128 past = i128(1) << 100;  // the start of the document after the last
  auto start = [&](i128 d) { return d < i128(starts.size()) ? i128(starts[size_t(d)]) : past; };
  std::vector<QueryTileDocs> out(size_t(q.n));
  for (i128 t = 0; t < q.n; ++t) {
    QueryTileDocs& e = out[size_t(t)];
    e.qmin = q.p + q.s * t, e.qmax = e.qmin + q.w;
    const i128 d0 = mask.doc_of(int64_t(e.qmin)), d1 = mask.doc_of(int64_t(e.qmax));
    e.first = start(d0), e.after_first = start(d0 + 1), e.after_last = start(d1 + 1), e.one_doc = d0 == d1;
  }
  return out;
}

// For each query tile, the key tiles seen and the key tiles full each form one interval of the
// key run's indices, since every condition bounds a key tile's lowest or highest position,
// which grow with its index; the bounds come from the query tile's first and last documents.
// The cost grows with the query run's tiles, not with the key run's; a key run wholly after
// the query run or outside its documents costs nothing more.
Pairs count_listed_documents(const Run& q, const std::vector<QueryTileDocs>& qd, const Run& k) {
  if (q.n == 0 || k.n == 0) return {};
  const i128 klast = highest(k);
  if (k.p > qd.back().qmax || klast < qd.front().first || k.p >= qd.back().after_last) return {};
  // The last index whose lowest position is <= x, the first whose lowest is >= x (a run of
  // step 0 has every tile at one place: all or none).
  auto upto = [&](i128 x) { return k.s > 0 ? fdiv(x - k.p, k.s) : k.p <= x ? i128(k.n - 1) : i128(-1); };
  auto from = [&](i128 x) { return k.s > 0 ? cdiv(x - k.p, k.s) : k.p >= x ? i128(0) : i128(k.n); };
  Pairs out;
  for (const QueryTileDocs& e : qd) {
    if (e.one_doc && k.p >= e.first && klast <= e.qmin && klast < e.after_first) {  // every key tile full
      out.seen += k.n, out.full += k.n;
      continue;
    }
    // Seen: lowest <= qmax (causal), highest >= the start of d0, lowest before the document after d1.
    const i128 lo = std::max<i128>(0, from(e.first - k.w));
    const i128 hi = std::min({i128(k.n - 1), upto(e.qmax), upto(e.after_last - 1)});
    if (hi < lo) continue;
    out.seen += hi - lo + 1;
    if (!e.one_doc) continue;
    // Full: highest <= qmin, and the whole key tile inside document d0.
    const i128 flo = std::max(lo, from(e.first)),
               fhi = std::min({hi, upto(e.qmin - k.w), upto(e.after_first - 1 - k.w)});
    if (fhi >= flo) out.full += fhi - flo + 1;
  }
  return out;
}

bool same_spans(const Spans& a, const Spans& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const Span& x, const Span& y) {
    return x.start == y.start && x.count == y.count && x.stride == y.stride;
  });
}

}  // namespace

// One side of a call as the counts read it: the spans and tile rows it came from, and their runs.
struct Side {
  Spans spans;
  int tile = -1;
  std::vector<Run> runs;
  std::vector<std::vector<QueryTileDocs>> docs;  // query side, listed documents: per run, per tile
  std::vector<i128> reach;                       // key side, listed documents: see State
  bool is(const Spans& s, int t) const { return t == tile && same_spans(s, spans); }
};

struct TileCounter::State {
  const cp::Config& c;
  TileCut cut;
  bool listed;  // documents of several lengths
  Mask m;
  // Query sides by their spans' hash: a scheme's steps attend one rank's queries in turn
  // (ring) or every rank's (passq), and finding each query tile's documents is most of the
  // count under a dispatch of small pieces. Dropped whole past a bound on what they hold.
  std::unordered_map<uint64_t, std::vector<Side>> queries;
  size_t held = 0;  // runs held in `queries`
  // The last call's key side. Under listed documents its runs are sorted by lowest position
  // (a sum over pairs does not depend on their order), and reach[i] is the highest position of
  // runs 0..i: the runs a query run can meet are found by bisection, not tried one by one
  // (an all-gathered K/V is thousands of runs in rank order).
  Side keys;

  State(const cp::Config& cfg, TileCut k)
      : c(cfg),
        cut(k),
        listed(cfg.mask.has_documents() && cfg.mask.doc_period() == 0),
        m{cfg.mask.is_causal(), cfg.mask.window(), cfg.mask.doc_period()} {}
  static uint64_t hash(const Spans& spans, int tile) {
    uint64_t h = uint64_t(tile) * 0x9E3779B97F4A7C15ull;
    for (const Span& x : spans)
      for (int64_t v : {x.start, x.count, x.stride}) h = (h ^ uint64_t(v)) * 0x100000001B3ull;
    return h;
  }
  const Side& query_side(const Spans& spans, int tile) {
    std::vector<Side>& bucket = queries[hash(spans, tile)];
    for (const Side& e : bucket)
      if (e.is(spans, tile)) return e;
    if (held > (size_t(1) << 20)) queries.clear(), held = 0;
    std::vector<Side>& into = queries[hash(spans, tile)];
    Side e{spans, tile, {}, {}, {}};
    tile_runs(spans, tile, e.runs);
    for (size_t i = 0; listed && i < e.runs.size(); ++i) e.docs.push_back(query_tile_docs(e.runs[i], c.mask));
    held += e.runs.size();
    into.push_back(std::move(e));
    return into.back();
  }
  const Side& key_side(const Spans& spans, int tile) {
    if (keys.is(spans, tile)) return keys;
    keys.spans = spans, keys.tile = tile;
    tile_runs(spans, tile, keys.runs);
    keys.reach.clear();
    if (!listed) return keys;
    std::sort(keys.runs.begin(), keys.runs.end(), [](const Run& x, const Run& y) { return x.p < y.p; });
    for (const Run& r : keys.runs)
      keys.reach.push_back(std::max(keys.reach.empty() ? highest(r) : keys.reach.back(), highest(r)));
    return keys;
  }
};

TileCounter::TileCounter(const cp::Config& c, TileCut cut) : st_(new State(c, cut)) {}
TileCounter::~TileCounter() = default;

TileCount TileCounter::operator()(const Spans& q, const Spans& kv, kernels::AttnTiles tiles) {
  State& s = *st_;
  const Side &qs = s.query_side(q, tiles.q), &ks = s.key_side(kv, tiles.k);
  i128 full = 0, partial = 0, full_area = 0, partial_area = 0;  // areas in rows x keys
  for (size_t i = 0; i < qs.runs.size(); ++i) {
    const Run& a = qs.runs[i];
    size_t b0 = 0, b1 = ks.runs.size();
    if (s.listed && a.n > 0) {  // key runs with a key at or after the first document, none past the last query
      const i128 from = qs.docs[i].front().first, upto = qs.docs[i].back().qmax;
      b0 = size_t(std::lower_bound(ks.reach.begin(), ks.reach.end(), from) - ks.reach.begin());
      b1 = size_t(
          std::partition_point(ks.runs.begin() + long(b0), ks.runs.end(), [&](const Run& r) { return r.p <= upto; }) -
          ks.runs.begin());
    }
    for (size_t j = b0; j < b1; ++j) {
      const Run& b = ks.runs[j];
      const Pairs p = s.listed ? count_listed_documents(a, qs.docs[i], b) : count_runs(a, b, s.m, s.cut);
      full += p.full, partial += p.seen - p.full;
      full_area += p.full * a.rows * b.rows, partial_area += (p.seen - p.full) * a.rows * b.rows;
    }
  }
  const double whole = double(tiles.q) * tiles.k;
  double q_tiles = 0, k_tiles = 0;
  for (const Run& r : qs.runs) q_tiles += double(r.n);
  for (const Run& r : ks.runs) k_tiles += double(r.n);
  return {double(full), double(partial), double(full_area) / whole, double(partial_area) / whole, q_tiles, k_tiles};
}

TileCount count_tiles(const cp::Config& c, const Spans& q, const Spans& kv, kernels::AttnTiles tiles, TileCut cut) {
  return TileCounter(c, cut)(q, kv, tiles);
}

}  // namespace minicp::predict
