// Measuring one case (see measure.hpp).
#include "miniapp/run/measure.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <iterator>

#include "comm/mpi_group.hpp"
#include "harness/memtrack.hpp"
#include "harness/stats.hpp"
#include "harness/watchdog.hpp"
#include "miniapp/cp/common.hpp"
#include "miniapp/model/layer.hpp"
#include "miniapp/record/dump.hpp"
#include "miniapp/run/dtype.hpp"
#include "miniapp/run/predict_cmds.hpp"

namespace minicp::run {

namespace hn = minicp::harness;

const std::vector<cp::Mode>& all_modes() {
  static const std::vector<cp::Mode> m = {cp::Mode::Full, cp::Mode::ComputeOnly, cp::Mode::CommOnly};
  return m;
}
int mode_code(cp::Mode m) { return int(std::find(all_modes().begin(), all_modes().end(), m) - all_modes().begin()); }

void at(Stage s) { hn::Watchdog::instance().phase(int64_t(s)); }

std::string stage_words(int64_t code) {
  static const char* words[] = {"at start-up",
                                "at start-up: aligning the ranks' clocks",
                                "at start-up: measuring the SGEMM ceiling",
                                "at start-up: timing the bf16 attention paths",
                                "at start-up: calibrating the performance model",
                                "calibrating the performance model (--calibrate)",
                                "at start-up: opening the results file",
                                "at the start of a round: measuring the layer rows again",
                                "setting it up",
                                "measuring the SGEMM ceiling",
                                "",
                                "writing the dump",
                                "gathering its figures",
                                "writing the results file",
                                "at the end: writing the results file"};
  static_assert(std::size(words) == size_t(Stage::Finishing) + 1, "a name for each Stage");
  return code >= 0 && code <= int64_t(Stage::Finishing) ? words[code] : "";
}

bool stage_of_case(int64_t code) { return code >= int64_t(Stage::SettingUp) && code <= int64_t(Stage::Writing); }

std::string iso_time_utc() {
  const std::time_t now = std::time(nullptr);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return b;
}

double step_useful_flops(const Case& c) {
  const cp::Config& a = c.stack.attn;
  const bool decode = c.stack.pass == model::Pass::Decode, train = c.stack.pass == model::Pass::Train;
  const double Nq = double(cp::global_q_tokens(a)), Nk = decode ? double(a.seq_len + a.decode_tokens) : Nq;
  model::LayerFlops f = model::layer_flops(c.stack.shape, Nq, Nk, a.mask.is_causal(), train, decode);
  // A window or documents: attention's useful FLOPs are its mask's area (4 D per visible pair
  // and head forward, 2.5x that backward), not the causal square's.
  const cp::Mask::Kind k = a.mask.kind();
  if (!decode && (k == cp::Mask::Kind::Window || k == cp::Mask::Kind::Documents))
    f.attention = 4.0 * a.head_dim * a.heads * a.mask.area(a.seq_len) * (train ? 3.5 : 1.0);
  return c.stack.mesh.dp() * c.stack.shape.layers * f.total();  // each DP replica runs its own sequence
}

const CeilingCache::Timed& CeilingCache::component(MPI_Comm g, const std::vector<int64_t>& key,
                                                   const std::function<double()>& measure) {
  Timed& t = cache_[key];
  int stale = MPI_Wtime() - t.taken > kFreshSeconds ? 1 : 0;
  MPI_Bcast(&stale, 1, MPI_INT, 0, g);
  if (stale) t.rate = measure(), t.taken = MPI_Wtime();
  return t;
}

CeilingCache::Reading CeilingCache::get(MPI_Comm g, int ranks, kernels::GemmShape s, bool bf16) {
  const auto sync = [g] {
    hn::Watchdog::instance().tick();  // each timed loop of a reading
    MPI_Barrier(g);
  };
  Reading r;
  const Timed& square = component(g, {ranks, 0}, [&] { return kernels::blas_gemm_rate({2048, 2048, 2048}, sync); });
  const Timed& tile = component(g, {ranks, 1}, [&] { return kernels::tile_gemm_rate(sync); });
  r.rates.blas_square = square.rate, r.rates.tile = tile.rate;
  r.taken = std::min(square.taken, tile.taken);
  const bool shaped = s.m > 0 && s.n > 0 && s.k > 0;
  if (shaped && !bf16) {
    const Timed& layer = component(g, {ranks, 2, s.m, s.n, s.k}, [&] { return kernels::blas_gemm_rate(s, sync); });
    r.rates.blas_layer = layer.rate;
    r.taken = std::min(r.taken, layer.taken);
  }
  if (bf16) {
    const Timed& sq = component(g, {ranks, 3}, [&] { return kernels::bf16_gemm_rate({2048, 2048, 2048}, sync); });
    const Timed& t16 = component(g, {ranks, 4}, [&] { return kernels::bf16_tile_gemm_rate(sync); });
    r.bf16.square = sq.rate, r.bf16.tile = t16.rate;
    r.taken = std::min({r.taken, sq.taken, t16.taken});
    if (shaped) {
      const Timed& layer = component(g, {ranks, 5, s.m, s.n, s.k}, [&] { return kernels::bf16_gemm_rate(s, sync); });
      r.bf16.layer = layer.rate;
      r.taken = std::min(r.taken, layer.taken);
    }
  }
  return r;
}

namespace {

// Resets the process's peak RSS (VmHWM) to its current RSS (Linux: /proc/self/clear_refs).
void reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return;
  std::fputs("5", f);
  std::fclose(f);
}

// Medians over reps of x, then gathered to the group's rank 0 (one value per rank).
std::vector<double> gather_median(const std::vector<double>& x, MPI_Comm g) {
  double m = hn::median(x);
  int size = 1;
  MPI_Comm_size(g, &size);
  std::vector<double> all(static_cast<size_t>(size));
  MPI_Gather(&m, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, 0, g);
  return all;
}

// Every rank's step rows on the group's rank 0 (each rank has as many).
std::vector<record::StepRow> gather_steps(const std::vector<record::StepRow>& mine, MPI_Comm g) {
  int size = 1, rank = 0;
  MPI_Comm_size(g, &size);
  MPI_Comm_rank(g, &rank);
  const int bytes = int(mine.size() * sizeof(record::StepRow));
  std::vector<record::StepRow> all(rank == 0 ? mine.size() * size_t(size) : 0);
  MPI_Gather(mine.data(), bytes, MPI_BYTE, all.data(), bytes, MPI_BYTE, 0, g);
  return all;
}

// The largest GEMM of a layer on the rows of the rank that holds most: the MLP's [N, C] x
// [C, F], N = T new tokens (decode) or ceil(S / P).
kernels::GemmShape largest_gemm(const Case& c) {
  const cp::Config& a = c.stack.attn;
  const int64_t rows = c.stack.pass == model::Pass::Decode ? a.decode_tokens : (a.seq_len + a.ranks - 1) / a.ranks;
  return {rows, c.stack.shape.ffn, c.stack.shape.hidden};
}

template <class T>
void record_rep(model::Stack<T>& st, const cp::Context& ctx, int L, bool train, cp::Mode mode, int rep, int rank,
                const double t[3], CaseResult& out) {
  const bool bwd = train && mode != cp::Mode::ComputeOnly && ctx.comm.job().size > 1;
  record::StepRow row{mode_code(mode),
                      rep,
                      rank,
                      t[0],
                      t[1],
                      t[2],
                      0,
                      0,
                      ctx.stats.comm_wait_s,
                      st.grad_allreduce_exposed_s(),
                      bwd ? st.grad_allreduce_busy_s() : 0.0,
                      0};
  constexpr int kTotal = model::kPhases;  // the "total" row of a layer (the sum of its phases)
  if (mode == cp::Mode::Full) out.fwd_phases = {}, out.bwd_phases = {};  // the last full rep's
  for (int l = 0; l < L; ++l)
    for (int dir = 0; dir < (train ? 2 : 1); ++dir) {
      const model::PhaseTimes& ph = dir == 0 ? st.forward_times(l) : st.backward_times(l);
      for (int i = 0; i < model::kPhases; ++i)
        out.record.timing.push_back({mode_code(mode), rep, rank, l, dir, i, ph.s[i]});
      out.record.timing.push_back({mode_code(mode), rep, rank, l, dir, kTotal, ph.total()});
      row.phases_s += ph.total();
      row.attn_s += ph.s[int(model::Phase::AttnCompute)] + ph.s[int(model::Phase::AttnComm)];
      row.tp_comm_s += ph.s[int(model::Phase::TpComm)];
      if (mode == cp::Mode::Full) (dir == 0 ? out.fwd_phases : out.bwd_phases) += ph;
    }
  out.record.steps.push_back(row);
}

// The reps of one round of a case: warm-up, then reps x modes interleaved, recording every
// rank's step row and per-layer phases into out, and its full-mode samples into out.rep_*; rep
// numbers start at first.
template <class T>
void run_reps(const Plan& p, const Case& c, model::Stack<T>& st, cp::Context& ctx, MPI_Comm g, int rank,
              CaseResult& out, int first) {
  const int L = c.stack.shape.layers;
  const bool train = c.stack.pass == model::Pass::Train;
  comm::Trace& trace = ctx.comm.trace();
  // This rank's GEMM FLOPs per step (the same on every rank).
  const double n = double(st.rows().size());
  const double gemm_flops_step =
      L * model::layer_flops(c.stack.shape, n, n, ctx.cfg.mask.is_causal(), train, false).gemm;
  for (int rep = 0; rep < p.deck.warmup + p.deck.reps; ++rep)
    for (cp::Mode mode : p.deck.modes) {
      const int r = rep < p.deck.warmup ? rep - p.deck.warmup : first + rep - p.deck.warmup;  // warm-ups < 0
      hn::Watchdog::instance().progress(c.index, r, int64_t(Stage::Reps));
      ctx.cfg.mode = mode;
      ctx.reset();
      trace.context().rep = r;
      trace.context().mode = mode_code(mode);
      MPI_Barrier(g);
      const double t0 = MPI_Wtime();
      st.forward(ctx);
      Kokkos::fence();
      const double t1 = MPI_Wtime();
      if (train) st.backward(ctx);
      Kokkos::fence();
      const double t2 = MPI_Wtime();
      if (r < 0) {
        trace.clear();  // warm-up: not recorded
        continue;
      }
      const double t[3] = {t1 - t0, t2 - t1, t2 - t0};
      record_rep(st, ctx, L, train, mode, r, rank, t, out);
      if (mode != cp::Mode::Full) continue;
      const record::StepRow& row = out.record.steps.back();
      out.rep_compute.push_back(row.phases_s - row.attn_comm_wait_s - row.grad_allreduce_s);
      out.rep_flops.push_back(ctx.stats.flops + gemm_flops_step);
      out.rep_bytes.push_back(double(ctx.bytes_sent()));
      out.rep_grad_bytes.push_back(double(st.grad_allreduce_bytes()));
      out.rep_tp_bytes.push_back(double(st.tp_bytes()));
    }
}

// The group's ceilings before and after the case: summed over its ranks.
void sum_ceilings(CaseResult& m, MPI_Comm g) {
  for (kernels::GemmCeiling* x : {&m.before, &m.after}) {
    double v[3] = {x->blas_square, x->blas_layer, x->tile};
    MPI_Allreduce(MPI_IN_PLACE, v, 3, MPI_DOUBLE, MPI_SUM, g);
    *x = {v[0], v[1], v[2]};
  }
  for (kernels::Bf16GemmCeiling* x : {&m.bf16_before, &m.bf16_after}) {
    double v[3] = {x->square, x->layer, x->tile};
    MPI_Allreduce(MPI_IN_PLACE, v, 3, MPI_DOUBLE, MPI_SUM, g);
    *x = {v[0], v[1], v[2]};
  }
}

template <class T>
void measure_typed(const Plan& p, const Case& c, comm::Communicator& comm, const std::string& dump,
                   CeilingCache& ceiling, CaseResult& out, int round) {
  const cp::SchemeInfo& info = *c.info;
  // The case's job: its mesh's ranks (with TP or DP, more than the CP group comm.world()). The
  // steps start together over it, its rows carry job ranks, and its figures are gathered over it.
  MPI_Comm g = comm::mpi_of(comm.job());
  const int rank = comm.job().rank, P = comm.job().size;
  const bool last = round == p.deck.rounds - 1;
  CaseResult& m = out;
  hn::MemTracker& mem = hn::MemTracker::instance();
  // The ceiling first: its buffers must not count as the case's memory.
  const kernels::GemmShape shape = largest_gemm(c);
  if (round == 0) {
    at(Stage::CaseCeiling);
    m.bf16 = std::is_same<T, kernels::bf16>::value;
    m.elem = sizeof(T);
    const CeilingCache::Reading before = ceiling.get(g, P, shape, m.bf16);
    m.before = before.rates, m.bf16_before = before.bf16, m.before_age_s = MPI_Wtime() - before.taken;
  }
  cp::release_scratch();  // the schemes' scratch of the cases before: this case is charged for its own
  mem.reset_peak();
  reset_peak_rss();
  const int64_t base = mem.current_bytes();
  const std::string space = kernels::Mem::name();  // the tensors' ("Host", "Cuda"): a GPU's high-water
  const int64_t space_base = mem.current_bytes(space);
  at(Stage::SettingUp);
  model::Stack<T> st(c.stack, info, comm);
  if (round == 0) m.start_utc = iso_time_utc();
  cp::Context ctx{comm, c.stack.attn};
  const bool train = c.stack.pass == model::Pass::Train;
  comm::Trace& trace = comm.trace();
  trace.set_enabled(!p.o.no_events);
  trace.clear();
  run_reps(p, c, st, ctx, g, rank, out, round * p.deck.reps);
  const size_t elem = sizeof(T);
  const record::MemoryRow mine{rank, mem.peak_bytes() - base, mem.peak_bytes(space) - space_base, hn::peak_rss_bytes(),
                               model::predicted_stack_bytes(c.stack, info, elem)};
  if (out.record.memory.empty()) out.record.memory.push_back(mine);
  record::MemoryRow& high = out.record.memory.front();  // the highest of the rounds
  high.kokkos_peak_bytes = std::max(high.kokkos_peak_bytes, mine.kokkos_peak_bytes);
  high.space_peak_bytes = std::max(high.space_peak_bytes, mine.space_peak_bytes);
  high.rss_peak_bytes = std::max(high.rss_peak_bytes, mine.rss_peak_bytes);
  if (last) m.end_utc = iso_time_utc();
  if (!dump.empty() && round == 0) {
    at(Stage::Dump);
    ctx.cfg.mode = cp::Mode::Full;
    ctx.reset();
    trace.set_enabled(false);
    st.forward(ctx);
    if (train) st.backward(ctx);
    record::write_dump(dump, st, c.stack, c.scheme, comm);
  }
  for (const comm::Event& e : trace.events())
    out.record.events.push_back({rank, e.rep, e.mode, e.layer, e.pass, e.step, int32_t(e.kind), e.peer, e.group,
                                 e.label, e.bytes, e.flops, e.t_begin, e.t_end});
  trace.clear();
  trace.set_enabled(false);
  cp::release_scratch();
  if (!last) return;
  at(Stage::Gathering);
  m.steps = gather_steps(out.record.steps, g);
  m.compute = gather_median(out.rep_compute, g);
  m.exec_flops = gather_median(out.rep_flops, g);
  m.bytes = gather_median(out.rep_bytes, g);
  m.grad_bytes = gather_median(out.rep_grad_bytes, g);
  m.tp_bytes = gather_median(out.rep_tp_bytes, g);
  for (size_t i = 0; i < m.bytes.size(); ++i) m.attn_bytes.push_back(m.bytes[i] - m.grad_bytes[i] - m.tp_bytes[i]);
  m.useful_flops = step_useful_flops(c);
  m.tokens = double(cp::global_q_tokens(ctx.cfg)) * c.stack.mesh.dp();
  at(Stage::CaseCeiling);
  const CeilingCache::Reading after = ceiling.get(g, P, shape, m.bf16);
  m.after = after.rates, m.bf16_after = after.bf16;
  at(Stage::Gathering);
  sum_ceilings(m, g);
}

// One layer's phases other than attention, as the stack runs them (forward, backward; backward
// 0 for decode), the slowest rank's, over the same layer's GEMMs each in its own loop
// (predict::layer_gemm_seconds), in pieces (3 at start-up): a piece runs layer steps, then the GEMMs, so
// that both are read in the same seconds. After a warm-up step, a piece runs at least 2 steps,
// more while they add up to under 0.25 s (a decode step of a few ms: its rank-to-rank jitter
// needs more samples than a training step's). Each pass keeps the piece whose layer over its
// GEMMs is the median of the pieces: a slow spell of the host that covers one piece's steps
// and not its GEMMs (or the reverse) skews that piece only.
template <class T>
predict::LayerTime time_layer(const Case& c, int64_t rows, int npieces, comm::Communicator& world) {
  MPI_Comm g = comm::mpi_of(world.world());
  // A whole layer on the CP group, whatever the case's mesh: the table's layer rows are of
  // whole layers (the model runs a TP slice's kernels at the whole layer's factor).
  model::StackConfig whole = c.stack;
  whole.mesh = comm::Mesh();
  whole.attn = model::attention_config(whole);
  model::Stack<T> st(whole, *c.info, world);
  cp::Context ctx{world, whole.attn};
  ctx.cfg.mode = cp::Mode::ComputeOnly;
  world.trace().set_enabled(false);
  const int L = c.stack.shape.layers;
  const bool train = c.stack.pass == model::Pass::Train;
  const std::string dtype = kernels::dtype_name<T>();
  auto kernels = [](const model::PhaseTimes& ph) {
    double s = 0;
    for (model::Phase k :
         {model::Phase::Norm, model::Phase::Qkv, model::Phase::Rope, model::Phase::OutProj, model::Phase::Mlp})
      s += ph.s[int(k)];
    return s;
  };
  // One step: this layer's kernel seconds (mean over layers) and the step's, slowest rank.
  auto step = [&](double t[3]) {
    hn::Watchdog::instance().tick();
    ctx.reset();
    MPI_Barrier(g);
    const double t0 = MPI_Wtime();
    st.forward(ctx);
    if (train) st.backward(ctx);
    Kokkos::fence();
    t[0] = t[1] = 0, t[2] = MPI_Wtime() - t0;
    for (int l = 0; l < L; ++l) {
      t[0] += kernels(st.forward_times(l)) / L;
      if (train) t[1] += kernels(st.backward_times(l)) / L;
    }
    MPI_Allreduce(MPI_IN_PLACE, t, 3, MPI_DOUBLE, MPI_MAX, g);  // every rank agrees on the loop
  };
  double t[3];
  step(t);  // warm-up
  const model::Shape& s = c.stack.shape;
  const int threads = int(Kokkos::DefaultHostExecutionSpace().concurrency());
  std::vector<predict::LayerTime> pieces;
  for (int k = 0; k < npieces; ++k) {
    std::vector<double> fwd, bwd;
    double spent = 0;
    for (int i = 0; i < 2 || (spent < 0.25 && i < 15); ++i) {
      step(t);
      fwd.push_back(t[0]), bwd.push_back(t[1]), spent += t[2];
    }
    const auto [gf, gb] = predict::layer_gemm_seconds(s, rows, dtype, train, world);
    pieces.push_back({dtype, threads, s.hidden, int64_t(s.heads) * s.head_dim, int64_t(s.kv_heads) * s.head_dim, s.ffn,
                      rows, hn::median(fwd), hn::median(bwd), gf, gb, world.world().size});
  }
  cp::release_scratch();
  return predict::median_layer_rows(pieces).front();
}

}  // namespace

void measure_layer_rows(const Plan& p, comm::Communicator& world, predict::Calibration& out, int pieces) {
  // Per row count and ranks of the cases (the ranks computing at once: a layer on one rank of
  // an idle host runs faster than on each rank of a full one), the first training case, else
  // the first decode case (forward only). Ranks beyond a case's wait.
  const int size = world.world().size, rank = world.world().rank;
  std::map<std::pair<int64_t, int>, const Case*> by_rows;
  for (model::Pass pass : {model::Pass::Train, model::Pass::Decode})
    for (const Case& c : p.cases)
      if (c.refused.empty() && c.stack.pass == pass && c.stack.attn.ranks <= size)
        by_rows.emplace(std::pair{rows_of(c), c.stack.attn.ranks}, &c);
  for (const auto& [key, c] : by_rows) {
    const auto [rows, P] = key;
    auto group = P == size
                     ? nullptr
                     : comm::make_mpi_comm(comm::Progress::None, 0, {}, comm::staging_for(kernels::kHostMemory), P);
    comm::Communicator& on = group ? *group : world;
    if (rank < P) {
      const predict::LayerTime l =
          with_dtype(p.deck.dtype, [&](auto t) { return time_layer<decltype(t)>(*c, rows, pieces, on); });
      if (rank == 0) out.layers.push_back(l);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

void measure_case(const Plan& p, const Case& c, comm::Communicator& comm, const std::string& dump,
                  CeilingCache& ceiling, CaseResult& out, int round) {
  with_dtype(p.deck.dtype, [&](auto t) { measure_typed<decltype(t)>(p, c, comm, dump, ceiling, out, round); });
}

}  // namespace minicp::run
