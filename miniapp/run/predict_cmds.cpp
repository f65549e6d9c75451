// The performance model's commands (see predict_cmds.hpp).
#include "miniapp/run/predict_cmds.hpp"

#include <malloc.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <type_traits>

#include "comm/comm.hpp"
#include "harness/cli.hpp"
#include "harness/fabric.hpp"
#include "harness/memory.hpp"
#include "harness/output.hpp"
#include "miniapp/record/h5.hpp"
#include "miniapp/run/driver.hpp"
#include "miniapp/run/dtype.hpp"
#include "miniapp/run/measure.hpp"

namespace minicp::run {

namespace hn = minicp::harness;
using hn::UsageError;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

size_t elem_of(const Deck& d) { return elem_size(d.dtype); }

// The deck's fabric profile (nullptr: none named).
std::unique_ptr<hn::FabricProfile> profile_of(const Deck& d) {
  if (d.fabric.empty()) return nullptr;
  return std::make_unique<hn::FabricProfile>(hn::load_fabric(d.fabric, "run.fabric"));
}

std::string fabric_name(const Deck& d) {
  if (d.fabric.empty()) return "default";
  return hn::load_fabric(d.fabric, "run.fabric").name;
}

// Ranks per node of a P-rank case: the flag; else one node for a local fabric (or none), the
// profile's nodes for an emulated one, 8 (one GPU node) for a cluster profile.
int ranks_per_node(const Deck& d, int P, int flag) {
  if (flag > 0) return flag;
  const auto prof = profile_of(d);
  if (!prof || prof->kind == "local") return P;
  if (prof->kind == "emulated")
    return std::max(1, (P + std::max(1, prof->emulated_nodes) - 1) / std::max(1, prof->emulated_nodes));
  return std::min(P, 8);
}

std::string us(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g us", s * 1e6);
  return b;
}
std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}
std::string gbs(double Bps) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g GB/s", Bps / 1e9);
  return b;
}

predict::Calibration table_of(const PredictOptions& o) {
  if (o.calibration.empty() && !o.against.empty()) {  // the table the run itself used
    const std::string text = record::read_string_attr(o.against, "/", "calibration");
    if (text.empty())
      throw UsageError("--against " + o.against +
                       ": the file holds no calibration table (run.calibration was unset); "
                       "give one with --calibration");
    try {
      predict::Calibration cal = predict::parse_calibration(text, o.against + " (its calibration attribute)");
      cal.of_the_run = record::read_string_attr(o.against, "/", "calibration_source") == "measured at start-up";
      return cal;
    } catch (const std::exception& e) {
      throw UsageError(std::string("--against ") + e.what());
    }
  }
  if (o.calibration.empty())
    throw UsageError(
        "--calibration: required by --predict and --advise (a table written by minicp --calibrate, "
        "e.g. --calibration results/calibration.txt; with --against, default: the file's own)");
  try {
    return predict::read_calibration(o.calibration);
  } catch (const std::exception& e) {
    throw UsageError(std::string("--calibration ") + e.what());
  }
}

// A deck is predicted from rates of its own precision: another's would time other kernels
// (bf16's GEMMs and attention run other code than fp32's, at other speeds).
void require_dtype(const Deck& d, const predict::Calibration& cal, int threads) {
  std::set<std::string> have;  // the precisions of the table's GEMM rates at these threads
  for (const predict::GemmRate& g : cal.gemm)
    if (g.threads == threads) have.insert(g.dtype);
  if (have.count(d.dtype)) return;
  std::string list;
  for (const std::string& t : have) list += (list.empty() ? "" : ", ") + t;
  throw UsageError("--calibration " + cal.source + ": the table has no " + d.dtype + " rates at " +
                   std::to_string(threads) + (threads == 1 ? " thread" : " threads") + " per rank (only " + list +
                   "), the deck's run.dtype: minicp --calibrate on this deck measures them into the table "
                   "(keeping its rows of other precisions)");
}

// A prediction times attention at the table's rates: a table without them is refused before
// any case is predicted, naming the row it lacks.
void require_attention(const Plan& p, const predict::Machine& m) {
  const bool trains =
      std::any_of(p.cases.begin(), p.cases.end(), [](const Case& c) { return c.stack.pass == model::Pass::Train; });
  for (const bool backward : {false, true}) {
    if (backward && !trains) continue;
    if (m.cal.find_attn(p.deck.dtype, m.threads, backward, p.deck.shape.head_dim)) continue;
    throw UsageError("--calibration " + m.cal.source + ": the table has no attention " +
                     (backward ? "backward" : "forward") + " rate for " + p.deck.dtype + " at " +
                     std::to_string(m.threads) + (m.threads == 1 ? " thread" : " threads") +
                     " per rank (an 'attn' row); minicp --calibrate on this deck measures it");
  }
}

}  // namespace

int64_t rows_of(const Case& c) {
  const cp::Config& a = c.stack.attn;
  return c.stack.pass == model::Pass::Decode ? a.decode_tokens : a.seq_len / a.ranks;
}

predict::CalibrationPlan calibration_plan(const Deck& d, const std::vector<Case>& cases, int rpn) {
  predict::CalibrationPlan plan;
  plan.shapes = {d.shape};
  std::set<int64_t> rows;
  for (const Case& c : cases)
    if (c.refused.empty()) rows.insert(rows_of(c));
  plan.rows.assign(rows.begin(), rows.end());
  plan.dtypes = {d.dtype};
  plan.fabric = fabric_name(d);
  const auto prof = profile_of(d);
  plan.cpu_copy_inter = !prof || prof->kind != "cluster";
  plan.progress_thread = comm::parse_progress(d.progress) == comm::Progress::Thread;
  std::set<std::tuple<int, int64_t, int, bool>> seen, seen_posted;
  for (const Case& c : cases) {
    if (!c.refused.empty()) continue;
    const cp::SchemeInfo& s = *c.info;
    if (!s.schedule) continue;
    const predict::Topo job{model::job_mesh(c.stack).ranks(), std::max(1, rpn)};
    const predict::Topo topo = predict::cp_topo(model::job_mesh(c.stack), job);
    const cp::Config& cfg = c.stack.attn;
    const bool tp_inter = predict::tp_spans_nodes(c.stack, job);
    for (bool bwd : {false, true}) {
      if (bwd && c.stack.pass != model::Pass::Train) continue;
      for (const model::TpCall& t : model::tp_calls(c.stack, rows_of(c), bwd, elem_of(d)))  // TP's, blocking
        if (seen.insert({int(t.op), t.payload, t.group, tp_inter}).second)
          plan.exposed.push_back({t.op, t.payload, t.group, tp_inter});
      for (const predict::Step& st : s.schedule(cfg, topo, 0, bwd, elem_of(d)).steps) {
        for (const predict::CommCall& e : st.exposed)
          if (seen.insert({int(e.op), e.payload, e.group, e.inter}).second) plan.exposed.push_back(e);
        for (const predict::CommCall& e : st.overlapped)
          if (predict::posted_op(e.op) && seen_posted.insert({int(e.op), e.payload, e.group, e.inter}).second)
            plan.posted.push_back(e);
      }
    }
  }
  return plan;
}

predict::Machine machine_for(const Deck& d, const predict::Calibration& cal, int threads, int rpn) {
  predict::Machine m;
  m.cal = cal;
  const std::vector<int> have = cal.threads();
  if (have.empty()) throw UsageError("--calibration " + cal.source + ": the table has no GEMM rates");
  if (threads <= 0)
    threads = have.size() == 1 ? have[0] : std::find(have.begin(), have.end(), 1) != have.end() ? 1 : have[0];
  if (std::find(have.begin(), have.end(), threads) == have.end()) {
    std::string list;
    for (int t : have) list += (list.empty() ? "" : ", ") + std::to_string(t);
    throw UsageError("--threads " + std::to_string(threads) + ": the table (" + cal.source + ") has rates at " + list +
                     " threads per rank only");
  }
  require_dtype(d, cal, threads);
  m.threads = threads;
  m.topo.ranks_per_node = rpn;
  const std::string name = fabric_name(d);
  const auto prof = profile_of(d);
  bool have_intra = false, have_inter = false;
  if (const predict::LinkRate* l = cal.find_link(name, "intra"))
    m.intra = {l->alpha_s, l->beta_Bps, l->cpu_Bps, "the table", l->allreduce_Bps, {}, {}, {}}, have_intra = true;
  if (const predict::LinkRate* l = cal.find_link(name, "inter"))
    m.inter = {l->alpha_s, l->beta_Bps, l->cpu_Bps, "the table", l->allreduce_Bps, {}, {}, {}}, have_inter = true;
  if (!have_inter && prof && prof->bandwidth_gbit_s > 0) {
    const double alpha = prof->latency_us > 0 ? prof->latency_us * 1e-6 : have_intra ? m.intra.alpha_s : 0;
    const double beta = prof->bandwidth_gbit_s * 1e9 / 8;
    m.inter = {alpha,
               beta,
               prof->kind == "cluster" ? 0.0 : (have_intra ? m.intra.beta_Bps : beta),
               "profile " + prof->name + " [link]",
               0,
               {},
               {},
               {}};
    have_inter = alpha > 0;
  }
  for (auto [link, scope] : {std::pair{&m.intra, "intra"}, std::pair{&m.inter, "inter"}}) {
    if (const predict::BusyRate* b = cal.find_busy(name, scope, "p2p")) link->busy_p2p = {b->wire_Bps, b->cpu_Bps};
    if (const predict::BusyRate* b = cal.find_busy(name, scope, "allreduce"))
      link->busy_allreduce = {b->wire_Bps, b->cpu_Bps};
    for (const predict::CollTime& t : cal.colls)
      if (t.fabric == name && t.scope == scope) link->colls.push_back(t);
  }
  if (!have_intra && have_inter) m.intra = m.inter, have_intra = true;
  if (!have_inter && have_intra) m.inter = m.intra;
  if (!have_intra)
    throw UsageError("fabric " + name + ": no link figures: the table (" + cal.source + ") has no 'link " + name +
                     "' rows and the profile states no [link] latency and bandwidth; measure them with minicp "
                     "--calibrate under that fabric");
  return m;
}

namespace {

predict::Prediction predict_case(const Case& c, predict::Machine m, const Deck& d, int rpn_flag) {
  m.topo.ranks = model::job_mesh(c.stack).ranks();
  m.topo.ranks_per_node = m.topo.ranks_per_node > 0 ? m.topo.ranks_per_node : ranks_per_node(d, m.topo.ranks, rpn_flag);
  return predict::predict_step(c.stack, *c.info, m, elem_of(d));
}

void print_header(const Plan& p, const predict::Machine& m, const char* what) {
  const std::string fabric = fabric_name(p.deck);
  std::printf("minicp %s: %s, %zu cases, table %s (%d threads per rank), fabric %s\n", what,
              hn::printable(p.o.deck).c_str(), p.cases.size(), hn::printable(m.cal.source).c_str(), m.threads,
              hn::printable(fabric).c_str());
  std::printf("  links: intra-node alpha %s, beta %s (%s); inter-node alpha %s, beta %s (%s)\n",
              us(m.intra.alpha_s).c_str(), gbs(m.intra.beta_Bps).c_str(), m.intra.source.c_str(),
              us(m.inter.alpha_s).c_str(), gbs(m.inter.beta_Bps).c_str(), m.inter.source.c_str());
  for (const char* scope : {"intra", "inter"})
    for (auto [kind, what] : {std::pair{"p2p", "exchange"}, std::pair{"allreduce", "all-reduce"}})
      if (const predict::BusyRate* b = m.cal.find_busy(fabric, scope, kind))
        std::printf("  beside compute, %s-node %s: %s; compute loses %s\n", scope, what, gbs(b->wire_Bps).c_str(),
                    b->cpu_Bps > 0 ? ("1 s per " + num(b->cpu_Bps / 1e9) + " GB moved").c_str() : "nothing measurable");
  // The collectives timed, one line per kind, scope, op and group: the smallest and the largest size.
  std::map<std::tuple<bool, std::string, std::string, int>, std::pair<predict::CollTime, predict::CollTime>> span;
  for (const predict::CollTime& t : m.cal.colls) {
    if (t.fabric != fabric) continue;
    auto& [lo, hi] = span.insert({{t.posted, t.scope, t.op, t.group}, {t, t}}).first->second;
    if (t.payload < lo.payload) lo = t;
    if (t.payload > hi.payload) hi = t;
  }
  for (const auto& [key, lh] : span) {
    const auto& [lo, hi] = lh;
    std::printf("  %s %s over %d ranks, %s-node: %s at %s", lo.posted ? "posted beside compute," : "blocking",
                lo.op.c_str(), lo.group, lo.scope.c_str(), us(lo.seconds).c_str(),
                hn::human_bytes(double(lo.payload)).c_str());
    if (hi.payload != lo.payload)
      std::printf(" .. %s at %s", us(hi.seconds).c_str(), hn::human_bytes(double(hi.payload)).c_str());
    std::printf(lo.posted ? " per call not hidden (measured)\n" : " per call (measured)\n");
  }
  // The layer rows of the deck's shape: how much slower the kernels run in a layer than alone.
  for (const predict::LayerTime& l : m.cal.layers) {
    if (m.cal.find_layer(l.dtype, m.threads, p.deck.shape, l.rows, l.ranks) != &l || l.dtype != p.deck.dtype) continue;
    const size_t elem = elem_of(p.deck);
    const std::string on =
        l.ranks > 0 ? ", " + std::to_string(l.ranks) + " rank" + (l.ranks > 1 ? "s" : "") + " computing" : "";
    std::printf("  layer kernels as run at %lld rows%s: %.3fx forward, %.3fx backward their own rates (measured)\n",
                (long long)l.rows, on.c_str(), predict::layer_factor(p.deck.shape, l.rows, false, l.ranks, m, elem),
                predict::layer_factor(p.deck.shape, l.rows, true, l.ranks, m, elem));
  }
}

// The measured step times and per-rank SGEMM of an existing results file, by case id.
struct FileCase {
  double time_s = kNaN, sgemm_per_rank = kNaN;
};
std::map<std::string, FileCase> measured_of(const std::string& file, const std::vector<Case>& cases) {
  std::map<std::string, FileCase> out;
  for (const Case& c : cases) {
    const std::string g = "/cases/" + c.id + "/summary";
    FileCase m;
    m.time_s = record::read_number_attr(file, g, "measured_time_s");
    m.sgemm_per_rank = record::read_number_attr(file, g, "sgemm_flops_per_s") / c.stack.attn.ranks;
    out[c.id] = m;
  }
  return out;
}

}  // namespace

void run_calibrate(const hn::Args& a, const Plan& p, comm::Communicator& world) {
  const PredictOptions& o = p.predict_opts;
  const std::string& path = o.calibration;  // checked and locked in the parse step (claim_outputs)
  const predict::CalibrationPlan plan = calibration_plan(p.deck, p.cases, world.topology().local_size);
  if (a.rank() == 0)
    std::printf("minicp --calibrate: %s, %zu row counts per rank, %d ranks x %d threads, fabric %s\n",
                hn::printable(p.o.deck).c_str(), plan.rows.size(), a.size(),
                int(Kokkos::DefaultHostExecutionSpace().concurrency()), hn::printable(plan.fabric).c_str());
  std::fflush(stdout);
  const auto t0 = std::chrono::steady_clock::now();
  predict::Calibration fresh = predict::measure_calibration(plan, world, a.rank() == 0);
  measure_layer_rows(p, world, fresh);
  if (a.rank() != 0) return;
  // Rows of an existing table that this measurement does not replace (other shapes, thread
  // counts, precisions, head dims, fabrics) are kept: decks calibrated in turn add up.
  predict::Calibration out;
  if (std::filesystem::exists(path)) {
    try {
      const predict::Calibration old = predict::read_calibration(path);
      auto kept = [](const auto& rows, const auto& fresh_rows, auto key) {
        std::set<decltype(key(rows.front()))> taken;
        for (const auto& r : fresh_rows) taken.insert(key(r));
        std::vector<std::decay_t<decltype(rows.front())>> out;
        for (const auto& r : rows)
          if (!taken.count(key(r))) out.push_back(r);
        return out;
      };
      out.sgemm = old.sgemm;
      if (!old.gemm.empty())
        out.gemm = kept(old.gemm, fresh.gemm, [](const predict::GemmRate& g) {
          return std::make_tuple(g.dtype, g.threads, g.ops, g.m, g.n, g.k);
        });
      if (!old.attn.empty())
        out.attn = kept(old.attn, fresh.attn, [](const predict::AttnRate& a) {
          return std::make_tuple(a.dtype, a.threads, a.backward, a.head_dim);
        });
      if (!old.elem.empty())
        out.elem = kept(old.elem, fresh.elem,
                        [](const predict::ElemRate& e) { return std::make_tuple(e.dtype, e.threads, e.op); });
      if (!old.links.empty())
        out.links =
            kept(old.links, fresh.links, [](const predict::LinkRate& l) { return std::make_tuple(l.fabric, l.scope); });
      if (!old.busy.empty())
        out.busy = kept(old.busy, fresh.busy,
                        [](const predict::BusyRate& b) { return std::make_tuple(b.fabric, b.scope, b.kind); });
      if (!old.colls.empty())
        out.colls = kept(old.colls, fresh.colls, [](const predict::CollTime& t) { return t.key(); });
      if (!old.layers.empty())
        out.layers = kept(old.layers, fresh.layers, [](const predict::LayerTime& l) { return l.key(); });
      out.info = old.info;
    } catch (const std::exception& e) {
      throw UsageError("--calibration " + path + ": exists and is not a calibration table (" + e.what() + ")");
    }
  }
  fresh.info.push_back({"measured_with", p.o.deck});
  out.merge(fresh);
  hn::write_text("--calibration", path, out.text());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "minicp --calibrate: %zu GEMM shapes, %zu attention rates, %zu links (%zu beside compute), "
      "%zu collectives (blocking and posted), %zu layers as run in %.1f s; table in %s\n",
      fresh.gemm.size(), fresh.attn.size(), fresh.links.size(), fresh.busy.size(), fresh.colls.size(),
      fresh.layers.size(), s, path.c_str());
}

// What --advise and --predict's advice rank a case as: its scheme, its dispatch where it has
// one ("ring/area"), its mesh where TP or DP is above 1 ("zigzag T8C8D1").
std::string variant_of(const Case& c) {
  const std::string mesh = c.stack.mesh.id();
  return (c.stack.attn.dispatch.empty() ? c.scheme : c.scheme + "/" + c.stack.attn.dispatch) +
         (mesh.empty() ? "" : " " + mesh);
}

// The cases ranked together: one pass, seq_len, job size (tp x cp x dp ranks) and document mix.
std::string advice_group(const Case& c) {
  return std::string(model::to_string(c.stack.pass)) + ", S = " + std::to_string(c.stack.attn.seq_len) + ", " +
         std::to_string(c.stack.mesh.ranks()) + " ranks" +
         (c.documents_label.empty() ? "" : ", documents " + c.documents_label);
}

// The model builds and frees each rank's schedule in turn while its tile counts keep what they
// found: with glibc's default trimming, the freed top of the heap goes back to the kernel and
// is faulted in again for the next rank (half the time of a 1024-rank case with a dispatch).
// The model's commands run nothing else in their process, so they keep the heap.
static void keep_heap() {
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
}

void run_predict(const Plan& p) {
  keep_heap();
  const PredictOptions& o = p.predict_opts;
  const predict::Calibration cal = table_of(o);
  const auto t0 = std::chrono::steady_clock::now();
  predict::Machine base = machine_for(p.deck, cal, o.threads, o.ranks_per_node);
  require_attention(p, base);
  base.topo.ranks_per_node = o.ranks_per_node;
  std::map<std::string, FileCase> meas;
  if (!o.against.empty()) meas = measured_of(o.against, p.cases);
  // --quiet: the summary lines only (a sweep of thousands of cases is one line).
  const bool rows = !p.o.quiet;
  if (rows) print_header(p, base, "--predict");
  if (rows)
    std::printf("%-40s %-10s %10s %10s %10s %10s %10s %10s %10s %12s %12s%s\n", "case", "scheme", "step s", "fwd s",
                "bwd s", "attn cmp s", "attn com s", "grad exp s", "tp com s", "tokens/s", "memory/rank",
                o.against.empty() ? "" : "  measured s  pred/meas");
  double worst = 1;
  std::string worst_id;
  int within = 0, compared = 0;
  std::map<std::string, std::vector<std::tuple<double, double, std::string>>> groups;  // key -> (pred, meas, scheme)
  for (size_t i = 0; i < p.cases.size(); ++i) {
    const Case& c = p.cases[i];
    if (!c.refused.empty()) {
      if (rows) std::printf("%-40s %-10s refused: %s\n", c.id.c_str(), c.scheme.c_str(), c.refused.c_str());
      continue;
    }
    predict::Machine m = base;
    const auto it = meas.find(c.id);
    const auto sg = m.cal.sgemm.find(m.threads);
    if (it != meas.end() && std::isfinite(it->second.sgemm_per_rank) && sg != m.cal.sgemm.end())
      m.rate_scale = it->second.sgemm_per_rank / sg->second;
    const predict::Prediction r = predict_case(c, m, p.deck, o.ranks_per_node);
    const double tokens = c.stack.mesh.dp() * double(c.stack.pass == model::Pass::Decode ? c.stack.attn.decode_tokens
                                                                                         : c.stack.attn.seq_len);
    if (rows)
      std::printf("%-40s %-10s %10.4g %10.4g %10.4g %10.4g %10.4g %10.4g %10.4g %12.4g %12s", c.id.c_str(),
                  c.scheme.c_str(), r.step_s, r.forward_s, r.backward_s, r.attn_compute_s, r.attn_comm_s,
                  r.grad_allreduce_exposed_s, r.phase_s[int(model::Phase::TpComm)], tokens / r.step_s,
                  hn::human_bytes(double(p.predicted_bytes[i])).c_str());
    if (it != meas.end() && std::isfinite(it->second.time_s)) {
      const double ratio = r.step_s / it->second.time_s;
      if (rows) std::printf("  %10.4g  %9.3f", it->second.time_s, ratio);
      ++compared;
      within += std::abs(ratio - 1) <= 0.15 ? 1 : 0;
      if (std::abs(ratio - 1) > std::abs(worst - 1)) worst = ratio, worst_id = c.id;
      if (c.scheme != "none") groups[advice_group(c)].push_back({r.step_s, it->second.time_s, variant_of(c)});
    }
    if (rows) std::printf("\n");
    for (const std::string& n : r.notes)
      if (rows) std::printf("    note: %s\n", n.c_str());
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("minicp --predict: %zu cases predicted in %.3f s\n", p.cases.size(), s);
  if (compared > 0) {
    int hits = 0, n = 0;
    for (const auto& [key, v] : groups) {
      if (v.size() < 2) continue;
      const auto best_pred =
          std::min_element(v.begin(), v.end(), [](auto& x, auto& y) { return std::get<0>(x) < std::get<0>(y); });
      const auto best_meas =
          std::min_element(v.begin(), v.end(), [](auto& x, auto& y) { return std::get<1>(x) < std::get<1>(y); });
      const bool hit = std::get<1>(*best_pred) <= 1.05 * std::get<1>(*best_meas);
      hits += hit ? 1 : 0;
      ++n;
      if (rows)
        std::printf("  advise %-22s: predicted best %-10s measured best %-10s (%+.1f%%): %s\n", key.c_str(),
                    std::get<2>(*best_pred).c_str(), std::get<2>(*best_meas).c_str(),
                    100 * (std::get<1>(*best_pred) / std::get<1>(*best_meas) - 1), hit ? "hit" : "miss");
    }
    std::printf("MINICP_MODEL against=%s cases=%d within_15pct=%d worst_ratio=%.3f worst_case=%s advise_hits=%d/%d\n",
                o.against.c_str(), compared, within, worst, worst_id.c_str(), hits, n);
  }
}

void run_advise(const Plan& p) {
  keep_heap();
  const PredictOptions& o = p.predict_opts;
  const predict::Calibration cal = table_of(o);
  predict::Machine base = machine_for(p.deck, cal, o.threads, o.ranks_per_node);
  require_attention(p, base);
  base.topo.ranks_per_node = o.ranks_per_node;
  print_header(p, base, "--advise");
  std::map<std::string, std::vector<const Case*>> groups;
  std::vector<std::string> order;
  for (const Case& c : p.cases) {
    if (c.scheme == "none" && c.stack.attn.ranks == 1 && c.refused.empty()) continue;  // the reference
    if (o.gpus > 0 && c.stack.mesh.ranks() != o.gpus) continue;                        // --gpus: its meshes
    const std::string key = advice_group(c);
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(&c);
  }
  for (const std::string& key : order) {
    if (o.gpus > 0)
      std::printf("%s (every mesh tp x cp, %d ranks to a node):\n", key.c_str(), base.topo.ranks_per_node);
    else
      std::printf("%s:\n", key.c_str());
    std::vector<std::pair<predict::Prediction, const Case*>> ok;
    std::vector<const Case*> refused;
    for (const Case* c : groups[key]) {
      if (!c->refused.empty()) {
        refused.push_back(c);
        continue;
      }
      ok.push_back({predict_case(*c, base, p.deck, o.ranks_per_node), c});
    }
    std::sort(ok.begin(), ok.end(), [](auto& x, auto& y) { return x.first.step_s < y.first.step_s; });
    for (size_t i = 0; i < ok.size(); ++i)
      std::printf("  %zu. %-20s %10.4g s/step  %+6.1f%%  %s\n", i + 1, variant_of(*ok[i].second).c_str(),
                  ok[i].first.step_s, 100 * (ok[i].first.step_s / ok[0].first.step_s - 1),
                  predict::explain(ok[i].first).c_str());
    // Closer than the model's own accuracy (docs/measurements.md): not a ranking to act on.
    std::string close;
    for (size_t i = 1; i < ok.size(); ++i)
      if (ok[i].first.step_s <= 1.05 * ok[0].first.step_s)
        close += (close.empty() ? "" : ", ") + variant_of(*ok[i].second);
    if (!close.empty())
      std::printf("     within 5%% of %s: %s (a tie at the model's accuracy)\n", variant_of(*ok[0].second).c_str(),
                  close.c_str());
    for (const Case* c : refused) std::printf("     %-20s refused: %s\n", variant_of(*c).c_str(), c->refused.c_str());
  }
}

void prediction_figures(record::Attrs& s, const Case& c, const predict::Machine& base, const Deck& d,
                        const double measured_phase_s[], double group_sgemm) {
  predict::Machine m = base;
  const auto sg = m.cal.sgemm.find(m.threads);
  if (std::isfinite(group_sgemm) && group_sgemm > 0 && sg != m.cal.sgemm.end())
    m.rate_scale = group_sgemm / c.stack.mesh.ranks() / sg->second;  // the job's ranks summed it
  s.real["prediction_rate_scale"] = m.rate_scale;
  std::string note;
  predict::Prediction r;
  bool ok = !m.cal.gemm.empty();
  if (!ok) note = "no calibration table (run.calibration or --calibration)";
  if (ok) try {
      r = predict_case(c, m, d, 0);
      for (const std::string& n : r.notes) note += (note.empty() ? "" : "; ") + n;
    } catch (const std::exception& e) {
      ok = false;
      note = e.what();
    }
  s.real["predicted_time_s"] = ok ? r.step_s : kNaN;
  s.real["predicted_forward_time_s"] = ok ? r.forward_s : kNaN;
  s.real["predicted_backward_time_s"] = ok && c.stack.pass == model::Pass::Train ? r.backward_s : kNaN;
  for (int i = 0; i < model::kPhases; ++i) {
    const std::string name = model::to_string(model::Phase(i));
    s.real["predicted_" + name + "_s"] = ok ? r.phase_s[i] : kNaN;
    s.real["measured_" + name + "_s"] = measured_phase_s[i];
  }
  s.real["prediction_ratio"] = ok ? r.step_s / s.real["measured_time_s"] : kNaN;
  s.text["prediction_note"] = note;
}

}  // namespace minicp::run
