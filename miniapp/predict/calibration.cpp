// The calibration table: its text form, parsing and lookups (see calibration.hpp); the
// measurement that fills one is calibration_measure.cpp.
#include "miniapp/predict/calibration.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "comm/trace.hpp"
#include "harness/input.hpp"

namespace minicp::predict {

namespace {

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

double log_distance(int64_t a, int64_t b) {
  return std::abs(std::log(double(std::max<int64_t>(a, 1)) / double(std::max<int64_t>(b, 1))));
}

}  // namespace

std::string Calibration::text() const {
  std::ostringstream o;
  o << "# minicp calibration table (docs/DESIGN.md, \"The performance model\"); rows:\n"
       "#   sgemm THREADS FLOP/S | gemm DTYPE THREADS OPS M N K FLOP/S |\n"
       "#   attn DTYPE THREADS PASS D TQ TK S/FULL-TILE S/PARTIAL-TILE S/CALL S/TILE-TOUCHED (per tile and head) |\n"
       "#   elem DTYPE THREADS OP S/VALUE | link FABRIC SCOPE ALPHA_S BETA_B/S CPU_B/S [ALLREDUCE_B/S] |\n"
       "#   busy FABRIC SCOPE p2p|allreduce WIRE_B/S CPU_B/S | coll FABRIC SCOPE OP GROUP PAYLOAD_B S/CALL |\n"
       "#   posted FABRIC SCOPE allgather|reduce_scatter GROUP PAYLOAD_B S/CALL-NOT-HIDDEN |\n"
       "#   layer DTYPE THREADS C HD KD F N FWD_S BWD_S [GEMM_FWD_S GEMM_BWD_S [RANKS]] | info KEY VALUE\n";
  for (const auto& [k, v] : info) o << "info " << k << " " << v << "\n";
  for (const auto& [t, r] : sgemm) o << "sgemm " << t << " " << num(r) << "\n";
  for (const GemmRate& g : gemm)
    o << "gemm " << g.dtype << " " << g.threads << " " << g.ops << " " << g.m << " " << g.n << " " << g.k << " "
      << num(g.flops_per_s) << "\n";
  for (const AttnRate& a : attn)
    o << "attn " << a.dtype << " " << a.threads << " " << (a.backward ? "bwd" : "fwd") << " " << a.head_dim << " "
      << a.tile_q << " " << a.tile_k << " " << num(a.full_s) << " " << num(a.partial_s) << " " << num(a.call_s) << " "
      << num(a.tile_s) << " " << num(a.item_s) << "\n";
  for (const ElemRate& e : elem)
    o << "elem " << e.dtype << " " << e.threads << " " << e.op << " " << num(e.s_per_value) << "\n";
  for (const LinkRate& l : links)
    o << "link " << l.fabric << " " << l.scope << " " << num(l.alpha_s) << " " << num(l.beta_Bps) << " "
      << num(l.cpu_Bps) << (l.allreduce_Bps > 0 ? " " + num(l.allreduce_Bps) : "") << "\n";
  for (const BusyRate& b : busy)
    o << "busy " << b.fabric << " " << b.scope << " " << b.kind << " " << num(b.wire_Bps) << " " << num(b.cpu_Bps)
      << "\n";
  for (const CollTime& t : colls)
    o << (t.posted ? "posted " : "coll ") << t.fabric << " " << t.scope << " " << t.op << " " << t.group << " "
      << t.payload << " " << num(t.seconds) << "\n";
  for (const LayerTime& l : layers)
    o << "layer " << l.dtype << " " << l.threads << " " << l.hidden << " " << l.q_width << " " << l.kv_width << " "
      << l.ffn << " " << l.rows << " " << num(l.forward_s) << " " << num(l.backward_s)
      << (l.gemm_forward_s > 0 ? " " + num(l.gemm_forward_s) + " " + num(l.gemm_backward_s) : "")
      << (l.gemm_forward_s > 0 && l.ranks > 0 ? " " + std::to_string(l.ranks) : "") << "\n";
  return o.str();
}

void Calibration::merge(const Calibration& o) {
  for (const auto& [t, r] : o.sgemm) sgemm[t] = r;
  gemm.insert(gemm.end(), o.gemm.begin(), o.gemm.end());
  attn.insert(attn.end(), o.attn.begin(), o.attn.end());
  elem.insert(elem.end(), o.elem.begin(), o.elem.end());
  links.insert(links.end(), o.links.begin(), o.links.end());
  busy.insert(busy.end(), o.busy.begin(), o.busy.end());
  colls.insert(colls.end(), o.colls.begin(), o.colls.end());
  layers.insert(layers.end(), o.layers.begin(), o.layers.end());
  info.insert(info.end(), o.info.begin(), o.info.end());
}

const GemmRate* Calibration::find_gemm(const std::string& dtype, int threads, const std::string& ops, int64_t m,
                                       int64_t n, int64_t k) const {
  const GemmRate* best = nullptr;
  double best_d = 1e300;
  for (const GemmRate& g : gemm) {
    if (g.dtype != dtype || g.threads != threads) continue;
    const double d = log_distance(g.m, m) + log_distance(g.n, n) + log_distance(g.k, k) + (g.ops == ops ? 0 : 100);
    if (d < best_d) best_d = d, best = &g;
  }
  return best;
}

const AttnRate* Calibration::find_attn(const std::string& dtype, int threads, bool backward, int head_dim) const {
  const AttnRate* best = nullptr;
  for (const AttnRate& a : attn)
    if (a.dtype == dtype && a.threads == threads && a.backward == backward &&
        (!best || std::abs(a.head_dim - head_dim) < std::abs(best->head_dim - head_dim)))
      best = &a;
  return best;
}

const ElemRate* Calibration::find_elem(const std::string& dtype, int threads, const std::string& op) const {
  for (const ElemRate& e : elem)
    if (e.dtype == dtype && e.threads == threads && e.op == op) return &e;
  return nullptr;
}

const LinkRate* Calibration::find_link(const std::string& fabric, const std::string& scope) const {
  const LinkRate* found = nullptr;
  for (const LinkRate& l : links)
    if (l.fabric == fabric && l.scope == scope) found = &l;  // the last row wins (a later measurement)
  return found;
}

const BusyRate* Calibration::find_busy(const std::string& fabric, const std::string& scope,
                                       const std::string& kind) const {
  const BusyRate* found = nullptr;
  for (const BusyRate& b : busy)
    if (b.fabric == fabric && b.scope == scope && b.kind == kind) found = &b;  // the last row wins
  return found;
}

const LayerTime* Calibration::find_layer(const std::string& dtype, int threads, const model::Shape& s, int64_t rows,
                                         int ranks) const {
  // Ranks first: a layer with every core of the host busy runs slower than alone on it.
  auto key = [&](const LayerTime& l) {
    return std::pair{l.ranks > 0 && ranks > 0 ? log_distance(l.ranks, ranks) : 0.0, log_distance(l.rows, rows)};
  };
  const LayerTime* best = nullptr;
  for (const LayerTime& l : layers)
    if (l.dtype == dtype && l.threads == threads && l.hidden == s.hidden &&
        l.q_width == int64_t(s.heads) * s.head_dim && l.kv_width == int64_t(s.kv_heads) * s.head_dim &&
        l.ffn == s.ffn && log_distance(l.rows, rows) <= std::log(2.0) + 1e-9 &&
        (!best || key(l) <= key(*best)))  // the last row wins a tie
      best = &l;
  return best;
}

std::vector<int> Calibration::threads() const {
  std::set<int> t;
  for (const GemmRate& g : gemm) t.insert(g.threads);
  return {t.begin(), t.end()};
}

bool is_coll_row_op(const std::string& op) {
  for (comm::EventKind k : {comm::EventKind::AllToAll, comm::EventKind::AllGather, comm::EventKind::ReduceScatter,
                            comm::EventKind::AllReduce})
    if (op == comm::to_string(k)) return true;
  return false;
}

namespace {

// A kernel rate row (sgemm, gemm, attn, elem) into c; false when malformed or out of range.
bool read_rate(const std::string& kind, std::istringstream& ls, Calibration& c) {
  bool ok = true;
  if (kind == "sgemm") {
    int t = 0;
    double r = 0;
    ok = bool(ls >> t >> r) && t > 0 && r > 0;
    if (ok) c.sgemm[t] = r;
  } else if (kind == "gemm") {
    GemmRate g;
    ok = bool(ls >> g.dtype >> g.threads >> g.ops >> g.m >> g.n >> g.k >> g.flops_per_s) && g.flops_per_s > 0 &&
         g.m > 0 && g.n > 0 && g.k > 0;
    if (ok) c.gemm.push_back(g);
  } else if (kind == "attn") {
    AttnRate a;
    std::string pass;
    ok = bool(ls >> a.dtype >> a.threads >> pass >> a.head_dim >> a.tile_q >> a.tile_k >> a.full_s >> a.partial_s >>
              a.call_s) &&
         (pass == "fwd" || pass == "bwd") && a.head_dim > 0 && a.tile_q > 0 && a.tile_k > 0 && a.full_s > 0 &&
         a.partial_s >= 0 && a.call_s >= 0;
    const bool touched = ok && bool(ls >> a.tile_s);  // optional columns: TOUCHED, then ITEM
    if (!touched) a.tile_s = 0;
    if (!(touched && ls >> a.item_s)) a.item_s = 0;
    ok = ok && a.tile_s >= 0 && a.item_s >= 0;
    a.backward = pass == "bwd";
    if (ok) c.attn.push_back(a);
  } else if (kind == "elem") {
    ElemRate e;
    ok = bool(ls >> e.dtype >> e.threads >> e.op >> e.s_per_value) && e.s_per_value >= 0;
    if (ok) c.elem.push_back(e);
  }
  return ok;
}

// A link row (link, busy, coll, posted) into c; false when malformed or out of range.
bool read_comm(const std::string& kind, std::istringstream& ls, Calibration& c) {
  bool ok = true;
  if (kind == "link") {
    LinkRate l;
    ok = bool(ls >> l.fabric >> l.scope >> l.alpha_s >> l.beta_Bps >> l.cpu_Bps) &&
         (l.scope == "intra" || l.scope == "inter") && l.alpha_s >= 0 && l.beta_Bps > 0 && l.cpu_Bps >= 0;
    if (ok && !(ls >> l.allreduce_Bps)) l.allreduce_Bps = 0;  // optional column
    ok = ok && l.allreduce_Bps >= 0;
    if (ok) c.links.push_back(l);
  } else if (kind == "busy") {
    BusyRate b;
    ok = bool(ls >> b.fabric >> b.scope >> b.kind >> b.wire_Bps >> b.cpu_Bps) &&
         (b.scope == "intra" || b.scope == "inter") && (b.kind == "p2p" || b.kind == "allreduce") && b.wire_Bps > 0 &&
         b.cpu_Bps >= 0;
    if (ok) c.busy.push_back(b);
  } else if (kind == "coll" || kind == "posted") {
    CollTime t;
    t.posted = kind == "posted";
    ok = bool(ls >> t.fabric >> t.scope >> t.op >> t.group >> t.payload >> t.seconds) &&
         (t.scope == "intra" || t.scope == "inter") && is_coll_row_op(t.op) && t.group >= 2 && t.payload > 0 &&
         (t.posted ? t.seconds >= 0 && (t.op == "allgather" || t.op == "reduce_scatter") : t.seconds > 0) &&
         t.seconds < 3600;
    if (ok) c.colls.push_back(t);
  }
  return ok;
}

// A layer row into c; false when malformed or out of range.
bool read_layer(std::istringstream& ls, Calibration& c) {
  bool ok = true;
  LayerTime l;
  ok = bool(ls >> l.dtype >> l.threads >> l.hidden >> l.q_width >> l.kv_width >> l.ffn >> l.rows >> l.forward_s >>
            l.backward_s) &&
       l.threads > 0 && l.hidden > 0 && l.q_width > 0 && l.kv_width > 0 && l.ffn > 0 && l.rows > 0 && l.forward_s > 0 &&
       l.backward_s >= 0 && l.forward_s < 3600 && l.backward_s < 3600;
  std::string more;
  if (ok && ls >> more) {  // the GEMMs timed beside it (optional: tables written before had none)
    std::istringstream g(more);
    ok = bool(g >> l.gemm_forward_s) && bool(ls >> l.gemm_backward_s) && l.gemm_forward_s > 0 &&
         l.gemm_backward_s >= 0 && l.gemm_forward_s < 3600 && l.gemm_backward_s < 3600;
    if (ok && ls >> more) {  // the ranks computing at once (optional: tables written before had none)
      std::istringstream r(more);
      ok = bool(r >> l.ranks) && r.eof() && l.ranks > 0 && !(ls >> more);
    }
  }
  if (ok) c.layers.push_back(l);
  return ok;
}

}  // namespace

Calibration parse_calibration(const std::string& text, const std::string& source) {
  Calibration c;
  c.source = source;
  std::istringstream in(text);
  std::string line;
  int no = 0;
  while (std::getline(in, line)) {
    ++no;
    if (const size_t h = line.find('#'); h != std::string::npos) line.erase(h);
    std::istringstream ls(line);
    std::string kind;
    if (!(ls >> kind)) continue;
    auto bad = [&](const std::string& why) {
      return std::runtime_error(source + ":" + std::to_string(no) + ": " + why + " (row '" + kind +
                                "'; see the header of miniapp/predict/calibration.hpp)");
    };
    if (kind == "info") {
      std::string k, v;
      ls >> k;
      std::getline(ls, v);
      c.info.emplace_back(k, v.empty() ? v : v.substr(1));
      continue;
    }
    bool ok = false;
    if (kind == "sgemm" || kind == "gemm" || kind == "attn" || kind == "elem")
      ok = read_rate(kind, ls, c);
    else if (kind == "link" || kind == "busy" || kind == "coll" || kind == "posted")
      ok = read_comm(kind, ls, c);
    else if (kind == "layer")
      ok = read_layer(ls, c);
    else
      throw bad("unknown row kind");
    if (!ok) throw bad("malformed or out-of-range values");
  }
  return c;
}

Calibration read_calibration(const std::string& path) {
  return parse_calibration(harness::read_input_file(path, harness::kCalibrationFile), path);
}

std::vector<LayerTime> median_layer_rows(const std::vector<LayerTime>& samples) {
  std::vector<LayerTime> out;
  std::set<decltype(LayerTime{}.key())> done;
  for (const LayerTime& first : samples) {
    if (!done.insert(first.key()).second) continue;
    std::vector<LayerTime> same;
    for (const LayerTime& l : samples)
      if (l.key() == first.key()) same.push_back(l);
    // Per pass, by layer / GEMMs without dividing by a 0 (a decode row's backward).
    auto median = [&](double LayerTime::*layer, double LayerTime::*gemm) {
      std::vector<LayerTime> v = same;
      std::sort(v.begin(), v.end(),
                [&](const LayerTime& x, const LayerTime& y) { return x.*layer * y.*gemm < y.*layer * x.*gemm; });
      return v[v.size() / 2];
    };
    const LayerTime f = median(&LayerTime::forward_s, &LayerTime::gemm_forward_s);
    const LayerTime b = median(&LayerTime::backward_s, &LayerTime::gemm_backward_s);
    LayerTime row = first;
    row.forward_s = f.forward_s, row.gemm_forward_s = f.gemm_forward_s;
    row.backward_s = b.backward_s, row.gemm_backward_s = b.gemm_backward_s;
    out.push_back(row);
  }
  return out;
}

}  // namespace minicp::predict
