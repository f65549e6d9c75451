// The performance model (see predict.hpp).
#include "miniapp/predict/predict.hpp"

#include "miniapp/cp/common.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <future>
#include <stdexcept>
#include <thread>

namespace minicp::predict {

using model::Phase;

std::vector<LayerOp> layer_ops(const model::Shape& s, int64_t N, bool backward, int64_t n) {
  const int64_t C = s.hidden, HD = int64_t(s.heads) * s.head_dim, KD = int64_t(s.kv_heads) * s.head_dim, F = s.ffn;
  const double nc = double(n < 0 ? N : n) * C;  // the norms' and residuals' rows
  auto g = [](Phase p, const char* ops, int64_t m, int64_t n, int64_t k) { return LayerOp{p, ops, m, n, k, "", 0}; };
  auto e = [](Phase p, const char* op, double values) { return LayerOp{p, "", 0, 0, 0, op, values}; };
  if (!backward)
    return {e(Phase::Norm, "rmsnorm_fwd", nc),
            g(Phase::Qkv, "NN", N, HD, C),
            g(Phase::Qkv, "NN", N, KD, C),
            g(Phase::Qkv, "NN", N, KD, C),
            e(Phase::Rope, "rope", double(N) * HD),
            e(Phase::Rope, "rope", double(N) * KD),
            e(Phase::OutProj, "copy", nc),
            g(Phase::OutProj, "NN", N, C, HD),
            e(Phase::Norm, "rmsnorm_fwd", nc),
            g(Phase::Mlp, "NN", N, F, C),
            g(Phase::Mlp, "NN", N, F, C),
            e(Phase::Mlp, "swiglu_fwd", double(N) * F),
            e(Phase::Mlp, "copy", nc),
            g(Phase::Mlp, "NN", N, C, F)};
  return {e(Phase::Mlp, "swiglu_fwd", double(N) * F),
          g(Phase::Mlp, "NT", N, F, C),
          g(Phase::Mlp, "TN", F, C, N),
          e(Phase::Mlp, "swiglu_bwd", double(N) * F),
          g(Phase::Mlp, "NT", N, C, F),
          g(Phase::Mlp, "NT", N, C, F),
          g(Phase::Mlp, "TN", C, F, N),
          g(Phase::Mlp, "TN", C, F, N),
          e(Phase::Norm, "rmsnorm_bwd", nc),
          e(Phase::Norm, "copy", nc),
          g(Phase::OutProj, "NT", N, HD, C),
          g(Phase::OutProj, "TN", HD, C, N),
          e(Phase::Rope, "rope", double(N) * HD),
          e(Phase::Rope, "rope", double(N) * KD),
          g(Phase::Qkv, "NT", N, C, HD),
          g(Phase::Qkv, "NT", N, C, KD),
          g(Phase::Qkv, "NT", N, C, KD),
          g(Phase::Qkv, "TN", C, HD, N),
          g(Phase::Qkv, "TN", C, KD, N),
          g(Phase::Qkv, "TN", C, KD, N),
          e(Phase::Norm, "rmsnorm_bwd", nc),
          e(Phase::Norm, "copy", nc)};
}

double comm_seconds(const CommCall& c, const Link& l) {
  const int n = c.group;
  if (n <= 1 && c.op != comm::EventKind::SendRecv) return 0;
  const double bytes = double(comm::bytes_leaving(c.op, c.payload, n));
  double hops = 1;
  switch (c.op) {
    case comm::EventKind::SendRecv: hops = 1; break;
    case comm::EventKind::AllReduce:  // recursive doubling for small buffers, a ring for large ones
      if (c.payload >= (64 << 10) && l.allreduce_Bps > 0) return bytes / l.allreduce_Bps;  // measured
      hops = c.payload < (64 << 10) ? 2 * std::ceil(std::log2(double(n))) : 2.0 * (n - 1);
      break;
    default: hops = n - 1; break;
  }
  return hops * l.alpha_s + (l.beta_Bps > 0 ? bytes / l.beta_Bps : 0);
}

namespace {
// The link's rows of the call's op and group, blocking (coll) or posted: the measured time at
// its size, linear between two sizes, else the nearest size's scaled as alpha-beta scales it;
// -1 without rows.
double measured_seconds(const CommCall& c, const Link& l, bool posted) {
  // The nearest measured sizes either side (of rows of one size, the last: a later measurement).
  const CollTime *below = nullptr, *above = nullptr;
  for (const CollTime& t : l.colls) {
    if (t.posted != posted || t.op != comm::to_string(c.op) || t.group != c.group) continue;
    if (t.payload <= c.payload && (!below || t.payload >= below->payload)) below = &t;
    if (t.payload >= c.payload && (!above || t.payload <= above->payload)) above = &t;
  }
  if (!below && !above) return -1;
  if (below && above) {
    if (below->payload == above->payload) return below->seconds;
    const double f = double(c.payload - below->payload) / double(above->payload - below->payload);
    return below->seconds + f * (above->seconds - below->seconds);
  }
  const CollTime& t = below ? *below : *above;
  const double model_there = comm_seconds({c.op, t.payload, c.group, c.inter}, l);
  return model_there > 0 ? t.seconds * comm_seconds(c, l) / model_there : t.seconds;
}
}  // namespace

double exposed_seconds(const CommCall& c, const Link& l) {
  const double t = measured_seconds(c, l, false);
  return t >= 0 ? t : comm_seconds(c, l);
}

bool posted_op(comm::EventKind op) { return op == comm::EventKind::AllGather || op == comm::EventKind::ReduceScatter; }

double posted_seconds(const CommCall& c, const Link& l) { return posted_op(c.op) ? measured_seconds(c, l, true) : -1; }

Beside beside_compute(const CommCall& c, const Link& l) {
  const bool big_allreduce = c.op == comm::EventKind::AllReduce && c.payload >= (64 << 10);
  const Link::Busy& b = big_allreduce ? l.busy_allreduce : l.busy_p2p;
  const double alone = comm_seconds(c, l), bytes = double(comm::bytes_leaving(c.op, c.payload, c.group));
  if (b.wire_Bps <= 0) {  // not measured beside compute: the link's own rate; a CPU copy, if any, is the loss
    // (a large all-reduce with a measured rate: all of it, reductions and copies)
    const double cpu = l.cpu_Bps <= 0 ? 0 : big_allreduce && l.allreduce_Bps > 0 ? alone : bytes / l.cpu_Bps;
    return {alone, cpu};
  }
  const double cpu = b.cpu_Bps > 0 ? bytes / b.cpu_Bps : 0;
  if (big_allreduce) return {bytes / b.wire_Bps, cpu};
  return {alone - bytes / l.beta_Bps + bytes / b.wire_Bps, cpu};  // the same latency terms
}

std::pair<double, double> overlap(double compute_s, double alone_s, const Beside& beside) {
  if (beside.wire_s <= 0) return {compute_s, 0.0};
  const double x = std::min(1.0, compute_s / beside.wire_s);  // the part that moves beside compute
  const double compute_end = compute_s + x * beside.cpu_s;
  return {compute_end, x < 1 ? compute_end + (1 - x) * alone_s : beside.wire_s};
}

namespace {

// The table's name of the stored type of `elem` bytes (the rows a case's rates come from).
std::string dtype_of(size_t elem) {
  if (elem == sizeof(double)) return kernels::dtype_name<double>();
  if (elem == sizeof(kernels::bf16)) return kernels::dtype_name<kernels::bf16>();
  return kernels::dtype_name<float>();
}

// The notes of one prediction, each once.
void add_note(std::vector<std::string>& notes, const std::string& n) {
  if (std::find(notes.begin(), notes.end(), n) == notes.end()) notes.push_back(n);
}

// Seconds of one kernel of the layer at the table's rates (unscaled by the drift scale).
double table_seconds(const Machine& m, const std::string& dtype, const LayerOp& op, std::vector<std::string>& notes) {
  if (op.ops.empty()) {
    const ElemRate* r = m.cal.find_elem(dtype, m.threads, op.elem);
    if (!r)
      add_note(notes, "no rate for " + op.elem + " (" + dtype + ", " + std::to_string(m.threads) + " threads): 0 s");
    return r ? op.values * r->s_per_value : 0.0;
  }
  const GemmRate* r = m.cal.find_gemm(dtype, m.threads, op.ops, op.m, op.n, op.k);
  if (!r)
    throw std::runtime_error("the calibration table (" + m.cal.source + ") has no GEMM rate for " + dtype + " at " +
                             std::to_string(m.threads) + " threads per rank");
  if (r->m != op.m || r->n != op.n || r->k != op.k || r->ops != op.ops)
    add_note(notes, "GEMM " + op.ops + " " + std::to_string(op.m) + "x" + std::to_string(op.n) + "x" +
                        std::to_string(op.k) + " not in the table: the rate of " + r->ops + " " + std::to_string(r->m) +
                        "x" + std::to_string(r->n) + "x" + std::to_string(r->k));
  return op.flops() / r->flops_per_s;
}

// The kernels of a layer on N rows at the table's own rates, unscaled (gemms false: its
// element-wise kernels only).
double own_layer_seconds(const Machine& m, const std::string& dtype, const model::Shape& s, int64_t N, bool backward,
                         std::vector<std::string>& notes, bool gemms = true) {
  double t = 0;
  for (const LayerOp& op : layer_ops(s, N, backward))
    if (gemms || op.ops.empty()) t += table_seconds(m, dtype, op, notes);
  return t;
}

// The layer as it ran over its kernels at their own rates. A row of the run's own table holds
// the run's speed (a median over the moments its cases ran at): the layer at the row's N is
// the row, at another N the row scaled as the table's kernels scale, and the drift scale of
// the case, one SGEMM reading against another, is not applied to it (single readings at a
// slow moment would bend it). A row from another run: its GEMMs as timed beside it (the same
// seconds: the host's drift cancels) and the element-wise kernels at the table's rates, for a
// row without those GEMMs every kernel at the table's rates, and the drift scale applies.
double factor_of(const Machine& m, const std::string& dtype, const model::Shape& s, int64_t N, bool backward, int ranks,
                 std::vector<std::string>& notes) {
  const LayerTime* l = m.cal.find_layer(dtype, m.threads, s, N, ranks);
  const double measured = !l ? 0 : backward ? l->backward_s : l->forward_s;
  if (!(measured > 0)) return 1;
  if (m.cal.of_the_run) return measured / (own_layer_seconds(m, dtype, s, l->rows, backward, notes) / m.rate_scale);
  const double gemm_beside = backward ? l->gemm_backward_s : l->gemm_forward_s;
  // The table's, unscaled; the GEMMs timed beside the row when it has them.
  const double own = (gemm_beside > 0 ? gemm_beside : 0.0) +
                     own_layer_seconds(m, dtype, s, l->rows, backward, notes, !(gemm_beside > 0));
  return own > 0 ? measured / own : 1;
}

// What one case's prediction reads from the calibration table, read once when the case is
// predicted: per pass the seconds of each kernel of the layer (in the layer, drift-scaled) and
// the attention rate; the copy kernel's rate. Nothing after this looks the table up.
struct CaseRates {
  struct Pass {
    std::vector<LayerOp> ops;
    std::vector<double> op_s;  // (ops) seconds of each in a running layer
    const AttnRate* attn = nullptr;
  } pass[2];
  double copy_s = 0;  // seconds per value of the schemes' copies
  double rate_scale = 1;

  CaseRates(const model::StackConfig& cfg, const Machine& m, const std::string& dtype, int64_t N,
            std::vector<std::string>& notes) {
    const cp::Config c = model::attention_config(cfg);
    rate_scale = m.rate_scale;
    for (int b = 0; b < (cfg.pass == model::Pass::Train ? 2 : 1); ++b) {
      Pass& p = pass[b];
      const int ranks = std::min(model::job_mesh(cfg).ranks(), std::max(1, m.topo.ranks_per_node));
      // With TP the slice's kernels, at the factor the whole layer's row gives (a ratio: the
      // table's rows are of whole layers).
      const double in_layer = factor_of(m, dtype, cfg.shape, N, b == 1, ranks, notes);
      p.ops = layer_ops(model::rank_shape(cfg), N, b == 1, model::sequence_parallel(cfg) ? N / cfg.mesh.tp() : N);
      for (const LayerOp& op : p.ops) p.op_s.push_back(in_layer * table_seconds(m, dtype, op, notes) / m.rate_scale);
      p.attn = attn_rate(m, dtype, c, b == 1, notes);
      const LayerOp copy{Phase::AttnCompute, "", 0, 0, 0, "copy", 1.0};
      if (b == 0) copy_s = table_seconds(m, dtype, copy, notes) / m.rate_scale;
    }
  }
  static const AttnRate* attn_rate(const Machine& m, const std::string& dtype, const cp::Config& c, bool backward,
                                   std::vector<std::string>& notes) {
    const AttnRate* r = m.cal.find_attn(dtype, m.threads, backward, c.head_dim);
    if (!r)
      throw std::runtime_error("the calibration table (" + m.cal.source + ") has no attention " +
                               (backward ? "backward" : "forward") + " rate for " + dtype + " at " +
                               std::to_string(m.threads) + " threads per rank");
    if (r->head_dim != c.head_dim)
      add_note(notes, std::string("attention ") + (backward ? "backward" : "forward") + " at head_dim " +
                          std::to_string(c.head_dim) + " not in the table: the rates of head_dim " +
                          std::to_string(r->head_dim) + " scaled by " + std::to_string(c.head_dim) + "/" +
                          std::to_string(r->head_dim) +
                          " (minicp --calibrate on a deck of this head_dim measures its own)");
    return r;
  }
  // Seconds of one attention call of a step.
  double attn(const cp::Config& c, TileCounter& count, const AttnCall& a, bool backward) const {
    const AttnRate* r = pass[backward ? 1 : 0].attn;
    const TileCount t = count(a.q, a.kv, {r->tile_q, r->tile_k});
    if (t.full + t.partial == 0) return 0;  // skipped as fully masked: no call
    // The table's rates are per whole tile and head at its head_dim; another head_dim scales
    // with D, a smaller tile with its area. Work items: the forward's are a query head's query
    // tile, the backward's a K/V head's key tile (kernels/attention_tiled.hpp).
    const double d = double(c.head_dim) / r->head_dim;
    const double items = backward ? a.kv_heads * t.k_tiles : a.heads * t.q_tiles;
    return (r->call_s +
            a.heads * d * (t.full_area * r->full_s + t.partial_area * r->partial_s + (t.full + t.partial) * r->tile_s) +
            items * d * r->item_s) /
           rate_scale;
  }
};

struct PassTime {
  double total = 0, compute = 0, comm = 0, exposed = 0, ratio = 0, imbalance = 1;
};

// The scheme's attention over one pass: steps synchronous over the ranks.
// Per-step maxima and per-rank compute of a range of ranks (one thread's share).
struct PassPart {
  std::vector<double> step_time, step_comp, step_wire, compute;  // compute: per rank of the range
  double exposed = 0;
};

PassPart attention_ranks(const cp::Config& c, const cp::SchemeInfo& s, const Machine& m, const CaseRates& rates,
                         bool backward, size_t elem, int r0, int r1) {
  PassPart p;
  p.compute.assign(size_t(r1 - r0), 0.0);
  const double aux_s = rates.copy_s;
  TileCounter count(c);
  for (int r = r0; r < r1; ++r) {
    const Schedule sch = s.schedule(c, m.topo, r, backward, elem);
    if (p.step_time.size() < sch.steps.size()) {
      p.step_time.resize(sch.steps.size(), 0.0);
      p.step_comp.resize(sch.steps.size(), 0.0);
      p.step_wire.resize(sch.steps.size(), 0.0);
    }
    for (size_t i = 0; i < sch.steps.size(); ++i) {
      const Step& st = sch.steps[i];
      double comp = st.aux_values * aux_s, alone = 0, exp = 0;
      Beside beside;
      for (const AttnCall& a : st.attn) comp += rates.attn(c, count, a, backward);
      for (const CommCall& cc : st.overlapped) {
        const Link& l = cc.inter ? m.inter : m.intra;
        const double posted = posted_seconds(cc, l);
        if (posted >= 0) {  // timed as the step posts it: what its compute does not hide
          exp += posted;
          continue;
        }
        const Beside b = beside_compute(cc, l);
        alone += comm_seconds(cc, l), beside.wire_s += b.wire_s, beside.cpu_s += b.cpu_s;
      }
      for (const CommCall& cc : st.exposed) exp += exposed_seconds(cc, cc.inter ? m.inter : m.intra);
      const auto [comp_end, wire_end] = overlap(comp, alone, beside);
      p.step_time[i] = std::max(p.step_time[i], exp + std::max(comp_end, wire_end));
      p.compute[size_t(r - r0)] += comp_end;
      p.step_comp[i] = std::max(p.step_comp[i], comp);
      p.step_wire[i] = std::max(p.step_wire[i], beside.wire_s);
      if (r == 0) p.exposed += exp + std::max(0.0, wire_end - comp_end);
    }
  }
  return p;
}

// The scheme's attention over one pass: steps synchronous over the ranks. The ranks are
// shared out over the host's threads (a 1024-rank case lists a million steps).
PassTime attention_pass(const cp::Config& c, const cp::SchemeInfo& s, const Machine& m, const CaseRates& rates,
                        bool backward, size_t elem) {
  const int P = c.ranks;
  const int T = P < 64 ? 1 : int(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  std::vector<std::future<PassPart>> parts;
  for (int t = 0; t < T; ++t)
    parts.push_back(std::async(T == 1 ? std::launch::deferred : std::launch::async, attention_ranks, std::cref(c),
                               std::cref(s), std::cref(m), std::cref(rates), backward, elem, P * t / T,
                               P * (t + 1) / T));
  std::vector<double> step_time, step_comp, step_wire, compute;
  double exposed = 0;
  for (auto& f : parts) {
    const PassPart p = f.get();
    auto fold = [](std::vector<double>& into, const std::vector<double>& v) {
      if (into.size() < v.size()) into.resize(v.size(), 0.0);
      for (size_t i = 0; i < v.size(); ++i) into[i] = std::max(into[i], v[i]);
    };
    fold(step_time, p.step_time), fold(step_comp, p.step_comp), fold(step_wire, p.step_wire);
    compute.insert(compute.end(), p.compute.begin(), p.compute.end());
    exposed += p.exposed;
  }
  double ratio = 0;
  // Wire time over compute of the steps that overlap the two (the slowest rank's of each).
  for (size_t i = 0; i < step_time.size(); ++i)
    if (step_comp[i] > 0 && step_wire[i] > 0) ratio = std::max(ratio, step_wire[i] / step_comp[i]);
  PassTime out;
  for (double t : step_time) out.total += t;
  double sum = 0, most = 0;
  for (double v : compute) sum += v, most = std::max(most, v);
  out.compute = most;
  out.comm = std::max(0.0, out.total - most);
  out.ratio = ratio;
  out.exposed = exposed;
  out.imbalance = sum > 0 ? most / (sum / P) : 1;
  return out;
}

}  // namespace

// Whether a group of job ranks spans nodes.
bool spans_nodes(const std::vector<int>& ranks, const Topo& t) {
  const auto [lo, hi] = std::minmax_element(ranks.begin(), ranks.end());
  return t.node(*lo) != t.node(*hi);
}

// The CP group's topology for the schedules: CP rank r is job rank base + r*stride (the group
// of job rank 0), so ranks_per_node/stride CP ranks share a node (1 when a stride spans one).
Topo cp_topo(const comm::Mesh& mesh, const Topo& job) {
  const std::vector<int> g = mesh.group(0, comm::Axis::CP);
  const int stride = g.size() > 1 ? g[1] - g[0] : 1;
  return Topo{mesh.cp(), std::max(1, job.ranks_per_node / stride)};
}

bool tp_spans_nodes(const model::StackConfig& cfg, const Topo& job) {
  return spans_nodes(model::job_mesh(cfg).group(0, comm::Axis::TP), job);
}

// Seconds of one layer's TP collectives (model::tp_calls), forward or backward, over the
// intra-node link unless the TP group spans nodes: each one's time less the GEMMs' that run
// beside it (tp_overlap; gemm_s_per_flop: the pass's GEMMs' seconds per FLOP), none below 0.
double tp_seconds(const model::StackConfig& cfg, int64_t N, bool backward, const Machine& m, size_t elem,
                  double gemm_s_per_flop) {
  const std::vector<model::TpCall> calls = model::tp_calls(cfg, N, backward, elem);
  if (calls.empty()) return 0;
  const bool inter = tp_spans_nodes(cfg, m.topo);
  double t = 0;
  for (const model::TpCall& c : calls)
    t += std::max(0.0, exposed_seconds(CommCall{c.op, c.payload, c.group, inter}, inter ? m.inter : m.intra) -
                           c.beside_flops * gemm_s_per_flop);
  return t;
}

// Seconds per FLOP of a pass's GEMMs, as the rates give them (0 without a GEMM).
double gemm_s_per_flop(const std::vector<LayerOp>& ops, const std::vector<double>& op_s) {
  double s = 0, f = 0;
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].flops() > 0) s += op_s[i], f += ops[i].flops();
  return f > 0 ? s / f : 0;
}

Prediction predict_step(const model::StackConfig& cfg, const cp::SchemeInfo& s, const Machine& job, size_t elem) {
  if (!s.schedule) throw std::runtime_error("scheme " + s.name + " describes no schedule");
  const comm::Mesh mesh = model::job_mesh(cfg);
  Machine m = job;  // the schedules see the CP group's nodes
  m.topo = cp_topo(mesh, job.topo);
  Prediction out;
  const cp::Config c = model::attention_config(cfg);
  const bool train = cfg.pass == model::Pass::Train;
  const int64_t N = cfg.pass == model::Pass::Decode ? c.decode_tokens : c.seq_len / c.ranks;
  const CaseRates rates(cfg, job, dtype_of(elem), N, out.notes);
  const int L = cfg.shape.layers;
  out.tp_inter = tp_spans_nodes(cfg, job.topo);
  double pass_s[2] = {0, 0};
  for (int b = 0; b < (train ? 2 : 1); ++b) {
    double layer = 0;
    const CaseRates::Pass& rp = rates.pass[b];
    for (size_t i = 0; i < rp.ops.size(); ++i) {
      out.phase_s[int(rp.ops[i].phase)] += L * rp.op_s[i];
      layer += rp.op_s[i];
    }
    const PassTime a = attention_pass(c, s, m, rates, b == 1, elem);
    const double tp = tp_seconds(cfg, N, b == 1, job, elem, gemm_s_per_flop(rp.ops, rp.op_s));
    out.phase_s[int(Phase::TpComm)] += L * tp;
    layer += tp;
    out.phase_s[int(Phase::AttnCompute)] += L * a.compute;
    out.phase_s[int(Phase::AttnComm)] += L * a.comm;
    out.attn_compute_s += L * a.compute;
    out.attn_comm_s += L * a.comm;
    out.comm_per_compute = std::max(out.comm_per_compute, a.ratio);
    out.exposed_attn_comm_s += L * a.exposed;
    out.imbalance = std::max(out.imbalance, a.imbalance);
    pass_s[b] = L * (layer + a.total);
  }
  // The weight-gradient all-reduces over the CP x DP group (of TP rank 0), queued behind the backward.
  const std::vector<int> grad_group = mesh.grad_group(0);
  const int grad_ranks = int(grad_group.size());
  if (train && grad_ranks > 1) {
    const bool inter = spans_nodes(grad_group, job.topo);
    const Link& l = inter ? m.inter : m.intra;
    const double params =
        double(model::layer_param_count(model::rank_shape(cfg))) * double(model::grad_allreduce_elem(cfg, elem));
    const double bucket = double(model::kGradBucketBytes);
    double alone = 0;  // one layer's buckets
    Beside beside;
    for (double at = 0; at < params; at += bucket) {
      const CommCall call{comm::EventKind::AllReduce, int64_t(std::min(bucket, params - at)), grad_ranks, inter};
      const Beside b = beside_compute(call, l);
      alone += comm_seconds(call, l), beside.wire_s += b.wire_s, beside.cpu_s += b.cpu_s;
    }
    // Each layer's backward runs beside the all-reduces still queued (in layers' worth).
    const double per_layer = pass_s[1] / L;
    double t = 0, queued = 0, copies = 0;
    for (int layer = 0; layer < L; ++layer) {
      if (queued > 0) {
        const double moved = beside.wire_s > 0 ? std::min(queued, per_layer / beside.wire_s) : queued;
        const double lost = moved * beside.cpu_s;
        t += lost, copies += lost, queued -= moved;
      }
      t += per_layer;
      queued += 1;
    }
    out.grad_allreduce_exposed_s = queued * alone;  // what is left moves after the last backward, alone
    out.phase_s[int(Phase::GradAllreduce)] = out.grad_allreduce_exposed_s + copies;
    pass_s[1] = t + out.grad_allreduce_exposed_s;
  }
  out.forward_s = pass_s[0];
  out.backward_s = pass_s[1];
  out.step_s = pass_s[0] + pass_s[1];
  return out;
}

double layer_factor(const model::Shape& s, int64_t N, bool backward, int ranks, const Machine& m, size_t elem) {
  std::vector<std::string> notes;
  return factor_of(m, dtype_of(elem), s, N, backward, ranks, notes);
}

std::vector<double> attention_area(const cp::Config& c, const cp::SchemeInfo& s) {
  if (!s.schedule) throw std::runtime_error("scheme " + s.name + " describes no schedule");
  std::vector<double> out(size_t(c.ranks), 0.0);
  const Topo topo{c.ranks, c.ranks};  // the pairs a rank computes do not depend on the nodes
  TileCounter count(c);
  for (int r = 0; r < c.ranks; ++r)
    for (const Step& st : s.schedule(c, topo, r, false, sizeof(float)).steps)
      for (const AttnCall& a : st.attn) out[size_t(r)] += a.heads * count(a.q, a.kv, {1, 1}).full;
  return out;
}

double needed_attention_bytes(const cp::Config& c, const cp::SchemeInfo& s, size_t elem, bool train) {
  std::vector<std::vector<int64_t>> q(size_t(c.ranks)), kv(size_t(c.ranks));
  for (int r = 0; r < c.ranks; ++r) {
    const cp::Shard sh = s.shard(c, r);
    q[size_t(r)] = sh.q, kv[size_t(r)] = sh.kv;
  }
  double tokens = 0;
  for (int r = 0; r < c.ranks; ++r) {
    // The keys rank r's queries see: the union of their intervals, merged in order.
    std::vector<std::pair<int64_t, int64_t>> seen;
    for (int64_t p : q[size_t(r)]) seen.push_back(c.mask.keys_of(p));
    std::sort(seen.begin(), seen.end());
    std::vector<std::pair<int64_t, int64_t>> merged;
    for (const auto& iv : seen)
      if (!merged.empty() && iv.first <= merged.back().second + 1)
        merged.back().second = std::max(merged.back().second, iv.second);
      else
        merged.push_back(iv);
    for (int o = 0; o < c.ranks; ++o) {
      if (o == r) continue;
      for (int64_t k : kv[size_t(o)]) {
        const auto it = std::upper_bound(merged.begin(), merged.end(), std::make_pair(k, INT64_MAX));
        if (it != merged.begin() && std::prev(it)->second >= k) tokens += 1;
      }
    }
  }
  const double per_token = double(c.kv_heads) * c.head_dim * (2.0 * elem + (train ? 2.0 * cp::dkv_elem(c, elem) : 0));
  return tokens * per_token;
}

MaskShare mask_share(const cp::Config& c, const cp::SchemeInfo& s, size_t elem, bool train) {
  return {attention_area(c, s), needed_attention_bytes(c, s, elem, train)};
}

std::string explain(const Prediction& p) {
  char buf[256];
  const double attn = p.attn_compute_s + p.attn_comm_s;
  std::string s;
  if (p.comm_per_compute > 0) {
    std::snprintf(buf, sizeof buf, "comm %.2gx compute per step, %s", p.comm_per_compute,
                  p.comm_per_compute > 1 ? "exposed" : "hidden");
    s = buf;
  } else if (p.attn_comm_s > 0) {
    std::snprintf(buf, sizeof buf, "comm not overlapped: %.0f%% of attention", 100 * p.attn_comm_s / attn);
    s = buf;
  } else {
    s = "no attention comm";
  }
  if (p.imbalance > 1.05) {
    std::snprintf(buf, sizeof buf, "; attention compute imbalanced %.2fx", p.imbalance);
    s += buf;
  }
  const double tp = p.phase_s[int(model::Phase::TpComm)];
  if (tp > 0) {
    std::snprintf(buf, sizeof buf, "; TP collectives %.0f%% of the step, %s", 100 * tp / p.step_s,
                  p.tp_inter ? "across nodes" : "inside a node");
    s += buf;
  }
  if (p.grad_allreduce_exposed_s > 0.01 * p.step_s) {
    std::snprintf(buf, sizeof buf, "; gradient all-reduce exposed %.0f%% of the step",
                  100 * p.grad_allreduce_exposed_s / p.step_s);
    s += buf;
  }
  return s;
}

}  // namespace minicp::predict
