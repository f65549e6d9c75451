// Records, the printed table and the ETA (see report.hpp).
#include "miniapp/run/report.hpp"

#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <type_traits>
#include <variant>

#include "kernels/attention.hpp"
#include "kernels/gemm.hpp"
#include "miniapp/record/dump.hpp"
#include "miniapp/run/figures.hpp"
#include "minicp_gitinfo.hpp"

extern char** environ;

namespace minicp::run {
namespace {

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// "NAME=value" of every environment variable with one of the prefixes, space-separated.
std::string env_with_prefixes(std::initializer_list<const char*> prefixes) {
  std::string s;
  for (char** e = environ; *e; ++e)
    for (const char* p : prefixes)
      if (std::string(*e).rfind(p, 0) == 0) s += (s.empty() ? "" : " ") + std::string(*e);
  return s;
}

// This process's CPU affinity as ranges ("0-1,4").
std::string affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return "unknown";
  std::string s;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    int e = c;
    while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, &set)) ++e;
    s += (s.empty() ? "" : ",") + std::to_string(c) + (e > c ? "-" + std::to_string(e) : "");
    c = e;
  }
  return s;
}

// Every rank's affinity, "r0:0-1 r1:0-1" (rank 0 gets it; collective).
std::string all_affinities(int ranks) {
  char mine[256] = {};
  std::snprintf(mine, sizeof mine, "%s", affinity().c_str());
  std::vector<char> all(size_t(ranks) * sizeof mine);
  MPI_Gather(mine, sizeof mine, MPI_CHAR, all.data(), sizeof mine, MPI_CHAR, 0, MPI_COMM_WORLD);
  std::string s;
  for (int r = 0; r < ranks; ++r) s += (r ? " r" : "r") + std::to_string(r) + ":" + std::string(&all[r * sizeof mine]);
  return s;
}

// The parent process (mpirun, srun's slurmstepd, a shell): its name and command line.
void launcher(std::string& name, std::string& cmdline) {
  const std::string dir = "/proc/" + std::to_string(getppid());
  std::ifstream comm(dir + "/comm"), cmd(dir + "/cmdline");
  std::getline(comm, name);
  cmdline.assign(std::istreambuf_iterator<char>(cmd), std::istreambuf_iterator<char>());
  for (char& ch : cmdline)
    if (ch == '\0') ch = ' ';
  while (!cmdline.empty() && cmdline.back() == ' ') cmdline.pop_back();
}

void build_attrs(record::Attrs& r) {
  r.text["minicp_version"] = MINICP_VERSION;
  r.text["git_sha"] = MINICP_GIT_SHA;
  r.text["git_dirty"] = MINICP_GIT_DIRTY;
  r.text["compiler"] = MINICP_COMPILER;
  r.text["compiler_flags"] = MINICP_CXX_FLAGS;
  r.text["kernel_flags"] = MINICP_KERNEL_FLAGS;
  r.text["kokkos_version"] = std::to_string(KOKKOS_VERSION);
  r.text["kokkos_exec_space"] = kernels::Exec::name();
  r.integer["kokkos_concurrency"] = kernels::Exec().concurrency();
  r.text["attention_tiles"] = kernels::attention_tiles();
  r.text["gemm_backend"] = kernels::gemm_backend();
  r.text["gemm_bf16_engine"] = kernels::gemm_bf16_engine();
  r.text["onednn_version"] = kernels::onednn_version();
  r.text["attention_isa"] = kernels::attention_isa();
}

void blas_attrs(record::Attrs& r, const harness::BlasInfo& b) {
  r.text["blas"] = b.name;
  r.text["blas_library"] = b.library;
  r.text["blas_version"] = b.version;
  r.text["blas_config"] = b.config;
  r.text["blas_core"] = b.core;
  r.text["blas_core_source"] = b.core_source;
  r.text["blas_warning"] = b.warning;
  r.text["cpu_model"] = b.cpu_model;
  r.text["cpu_flags"] = b.cpu_flags;
  r.text["cpu_isa"] = harness::to_string(b.cpu_isa);
}

// The Slurm job this run belongs to ("" / -1 outside Slurm).
void slurm_attrs(record::Attrs& r) {
  const std::pair<const char*, const char*> text[] = {{"SLURM_JOB_ID", "slurm_job_id"},
                                                      {"SLURM_ARRAY_JOB_ID", "slurm_array_job_id"},
                                                      {"SLURM_ARRAY_TASK_ID", "slurm_array_task_id"},
                                                      {"SLURM_JOB_NODELIST", "slurm_job_nodelist"},
                                                      {"SLURM_JOB_PARTITION", "slurm_job_partition"},
                                                      {"SLURM_CLUSTER_NAME", "slurm_cluster_name"}};
  for (const auto& [var, attr] : text) {
    const char* e = std::getenv(var);
    r.text[attr] = e ? e : "";
  }
  const char* nn = std::getenv("SLURM_JOB_NUM_NODES");
  r.integer["slurm_job_num_nodes"] = nn ? std::atoll(nn) : -1;
}

// The fabric profile asked for and what MPI selected.
void fabric_attrs(record::Attrs& r, const harness::MpiSelection& sel) {
  const harness::FabricProfile* f = harness::applied_fabric();
  r.text["fabric"] = f ? f->name : "";
  r.text["fabric_kind"] = f ? f->kind : "";
  r.text["fabric_description"] = f ? f->description : "";
  r.text["fabric_settings"] = f ? f->settings() : "";
  r.text["fabric_file"] = f ? f->path : "";
  r.real["fabric_link_bandwidth_gbit_s"] = f ? f->bandwidth_gbit_s : 0.0;
  r.real["fabric_link_latency_us"] = f ? f->latency_us : 0.0;
  r.text["mpi_pml"] = sel.pml;
  r.text["mpi_btls"] = sel.btl_list();
  r.text["mpi_selection_source"] = sel.how;
  const char* tls = std::getenv("UCX_TLS");
  r.text["ucx_tls"] = sel.pml == "ucx" ? (tls ? tls : "UCX's default (all available)") : "";
}

// The deck keys whose rows are case attributes (run.dtype, the model's shape, run.reps, ...):
// the deck's value, the same in every case. The sweep's lists are not among them: each case
// writes its own value of those (seq_len, ranks, the scheme settings).
void deck_attrs(record::Attrs& a, const Deck& d) {
  for (const DeckKey& k : deck_keys()) {
    if (!k.case_attr) continue;
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, int64_t>)
            a.integer[k.name] = v;
          else if constexpr (std::is_same_v<T, double>)
            a.real[k.name] = v;
          else if constexpr (std::is_same_v<T, std::string>)
            a.text[k.name] = v;
        },
        k.get(d));
  }
}

}  // namespace

record::Attrs platform_attrs(const harness::Args& a, const Plan& p, const comm::Communicator& world,
                             const harness::BlasInfo& blas, const ProgressSettings& prog) {
  record::Attrs r;
  build_attrs(r);
  blas_attrs(r, blas);
  r.text["comm_backend"] = wants_nccl() ? "nccl" : world.backend();  // the cases' communicator (case_comm)
  r.text["progress"] = p.deck.progress;
  // What the code says of itself, so that a reader of the file needs no second copy.
  r.text["scheme_registry"] = cp::registry_json();
  r.text["figure_catalog"] = figure_catalog_json();
  r.integer["progress_poll_us"] = prog.poll_us;
  r.text["progress_cpus"] = prog.cpus;
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(lib, &len);
  r.text["mpi_library"] = std::string(lib, size_t(len));
  std::string hosts;
  for (const std::string& h : world.topology().hosts) hosts += (hosts.empty() ? "" : ",") + h;
  r.text["hosts"] = hosts;
  r.integer["world_ranks"] = a.size();
  const comm::Topology& topo = world.topology();
  r.integer["nodes"] = topo.nodes;
  int most_local = 0;
  for (int n = 0; n < topo.nodes; ++n)
    most_local = std::max(most_local, int(std::count(topo.node_of_rank.begin(), topo.node_of_rank.end(), n)));
  r.integer["ranks_per_node"] = most_local;  // the most on any node (min_local_size: the fewest)
  r.integer["ranks_per_node_min"] = topo.min_local_size;
  slurm_attrs(r);
  fabric_attrs(r, p.mpi);
  r.text["environment"] = env_with_prefixes({"OMP_", "OPENBLAS_", "KOKKOS_", "GOMP_", "MKL_", "UCX_", "SLURM_CPU"});
  r.text["cpu_affinity"] = all_affinities(a.size());
  launcher(r.text["launcher"], r.text["launcher_command_line"]);
  r.text["start_time"] = iso_time_utc();
  r.text["deck"] = p.deck.resolved;
  std::string cmd;
  for (const std::string& w : a.args()) cmd += (cmd.empty() ? "" : " ") + w;
  for (const std::string& w : a.kokkos_args()) cmd += " " + w;
  r.text["command_line"] = cmd;
  return r;
}

// The case's documents in numbers, every case (one document without a documents mask):
// documents_count, and the lengths' median, 90th percentile (nearest rank: the length at
// place ceil(p n) of n sorted) and longest, in tokens.
void documents_attrs(record::Attrs& a, const cp::Mask& m, int64_t S) {
  const int64_t L = m.doc_period();
  const int64_t n = L > 0 ? S / L + (S % L != 0) : 0;
  std::vector<int64_t> len;
  if (L == 0) len = m.doc_lengths(S), std::sort(len.begin(), len.end());
  // Equal documents, counted: the short last one (if any) first in sorted order, then n of L.
  auto at = [&](int64_t k) { return L == 0 ? len[size_t(k)] : (k == 0 && S % L != 0) ? S % L : L; };
  const int64_t count = L > 0 ? n : int64_t(len.size());
  auto rank = [&](double p) { return at(std::max<int64_t>(0, int64_t(std::ceil(p * double(count))) - 1)); };
  a.integer["documents_count"] = count;
  a.integer["documents_p50_tokens"] = rank(0.5), a.integer["documents_p90_tokens"] = rank(0.9);
  a.integer["documents_max_tokens"] = at(count - 1);
}

record::Attrs case_attrs(const Case& c, const Deck& d, const comm::Topology& topo) {
  record::Attrs a;
  const cp::Config& cfg = c.stack.attn;
  a.text["scheme"] = c.scheme;
  a.text["pass"] = model::to_string(c.stack.pass);
  a.text["mask"] = cfg.mask.name();
  a.text["documents"] = c.documents, a.text["documents_label"] = c.documents_label;
  a.text["dispatch"] = cfg.dispatch.empty() ? "layout" : cfg.dispatch;
  documents_attrs(a, cfg.mask, cfg.seq_len);
  a.text["status"] = c.refused.empty() ? "ok" : "refused: " + c.refused;
  a.integer["seq_len"] = cfg.seq_len, a.integer["ranks"] = cfg.ranks;
  // The mesh: ranks is its CP degree; the job's ranks are tp x ranks x dp.
  a.integer["tp"] = c.stack.mesh.tp(), a.integer["dp"] = c.stack.mesh.dp();
  a.text["rank_order"] = c.stack.mesh.order();
  a.integer["decode_tokens"] = cfg.decode_tokens;
  a.integer["causal"] = cfg.mask.is_causal() ? 1 : 0;
  for (const auto& [name, v] : cfg.settings) a.integer[name] = v;
  if (c.refused.empty())  // the scheme's own settings as they run (a refused case ran nothing)
    for (const cp::Setting& st : c.info->settings)
      if (st.resolve) a.integer[st.name] = st.resolve(cfg, topo);
  deck_attrs(a, d);
  return a;
}

void print_case(const Case& c, const record::Attrs& summary, const CaseResult& m) {
  const auto& f = summary.real;
  const int L = c.stack.shape.layers;
  auto opt = [&](const char* k, double scale = 1) {
    return std::isnan(f.at(k)) ? std::string("-") : fmt("%.3f", scale * f.at(k));
  };
  std::printf("  %-10s %6s %9s %5s %13s %13s %9s %11s %10s %12s %7s %8s %8s %8s %9s\n", "scheme", "pass", "S", "ranks",
              "fwd/layer[ms]", "bwd/layer[ms]", "step[s]", "tokens/s", "GFLOP/s", "ceiling[GF/s]", "/ceil", "overlap",
              "attn_ov", "grad_ov", "wait[ms]");
  std::printf("  %-10s %6s %9lld %5d %13.3f %13s %9.4f %11.1f %10.1f %12.1f %7.3f %8s %8s %8s %9.2f\n",
              c.scheme.c_str(), model::to_string(c.stack.pass), (long long)c.stack.attn.seq_len, c.stack.attn.ranks,
              1e3 * f.at("forward_time_s") / L, opt("backward_time_s", 1e3 / L).c_str(), f.at("measured_time_s"),
              f.at("tokens_per_s"), f.at("useful_flops_per_s") / 1e9, f.at("gemm_ceiling_flops_per_s") / 1e9,
              f.at("layer_efficiency"), opt("overlap").c_str(), opt("attn_overlap").c_str(),
              opt("grad_allreduce_overlap").c_str(), 1e3 * f.at("comm_wait_s"));
  for (int dir = 0; dir < 2; ++dir) {
    const model::PhaseTimes& ph = dir == 0 ? m.fwd_phases : m.bwd_phases;
    if (ph.total() <= 0) continue;
    std::printf("  %s phases per layer [ms]:", dir == 0 ? "fwd" : "bwd");
    for (int i = 0; i < model::kPhases; ++i)
      std::printf(" %s %.2f", model::to_string(model::Phase(i)), 1e3 * ph.s[i] / L);
    std::printf("\n");
  }
  for (const char* k : {"overlap_note", "attn_overlap_note", "grad_allreduce_overlap_note"})
    if (!summary.text.at(k).empty()) std::printf("  %s: %s\n", k, summary.text.at(k).c_str());
  if (!summary.text.at("out_of_range").empty())
    std::printf("  WARNING: figures outside their range (a measurement defect, not a result): %s\n",
                summary.text.at("out_of_range").c_str());
  const double slow = f.at("slowest_rep_ratio");
  if (slow > 2.0)
    std::printf(
        "  WARNING: a rep took %.1fx the median step (%.3f s): a rank stalled or the machine was busy; "
        "every rep is in the results file\n",
        slow, slow * f.at("measured_time_s"));
}

std::string summary_token(const Case& c, const record::Attrs& summary) {
  return std::string(model::to_string(c.stack.pass)) + "_" + c.scheme + "_S" + std::to_string(c.stack.attn.seq_len) +
         "_" + ranks_token(c.stack.mesh) + (c.documents_label.empty() ? "" : "_docs" + c.documents_label) +
         (c.stack.attn.dispatch.empty() ? "" : "_dispatch" + c.stack.attn.dispatch) + "=" +
         fmt("%.3f", summary.real.at("layer_efficiency"));
}

std::string report_case(const Case& c, const record::Attrs& summary, const CaseResult& m, bool quiet) {
  if (!quiet) print_case(c, summary, m);
  return summary_token(c, summary);
}

Eta::Eta(const Plan& p, const std::vector<const Case*>& todo) : p_(p) {
  for (const Case* c : todo) left_ += cost(*c);
}

double Eta::cost(const Case& c) const {
  if (!c.refused.empty()) return 0.0;
  return step_useful_flops(c) * (p_.deck.warmup + p_.deck.reps) * double(p_.deck.modes.size());
}

std::string Eta::start(const Case& c, double elapsed_s) {
  done_ += prev_, left_ -= prev_, prev_ = cost(c);  // the previous case is done
  return done_ > 0 ? ", ETA " + fmt("%.1f", elapsed_s / done_ * left_) + " s" : "";
}

}  // namespace minicp::run
