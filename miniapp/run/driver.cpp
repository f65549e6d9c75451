// The minicp driver (see driver.hpp).
#include "miniapp/run/driver.hpp"

#include <mpi.h>

#include <unistd.h>
#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <memory>

#include "comm/comm.hpp"
#include "harness/blas.hpp"
#include "harness/cli.hpp"
#include "harness/clock.hpp"
#include "harness/input.hpp"
#include "harness/lock.hpp"
#include "harness/main.hpp"
#include "harness/memory.hpp"
#include "harness/memtrack.hpp"
#include "harness/output.hpp"
#include "harness/watchdog.hpp"
#include "kernels/attention.hpp"
#include "kernels/gemm.hpp"
#include "kernels/types.hpp"
#include "miniapp/model/layer.hpp"
#include "miniapp/record/dump.hpp"
#include "miniapp/record/h5.hpp"
#include "miniapp/record/results.hpp"
#include "miniapp/run/documents.hpp"
#include "miniapp/run/dtype.hpp"
#include "miniapp/run/figures.hpp"
#include "miniapp/run/measure.hpp"
#include "miniapp/run/report.hpp"

namespace minicp::run {
namespace {

namespace hn = minicp::harness;
using hn::UsageError;

void print_dry_run(const Plan& p, double avail_per_rank, bool target) {
  if (target)
    std::printf("minicp --dry-run: %zu cases; memory per rank of the target node (--rank-memory): %s\n", p.cases.size(),
                hn::human_bytes(avail_per_rank).c_str());
  else
    std::printf("minicp --dry-run: %zu cases; memory available per rank: %s (%d ranks on this node)\n", p.cases.size(),
                avail_per_rank >= 0 ? hn::human_bytes(avail_per_rank).c_str() : "unknown", p.topo.local_size);
  if (p.o.quiet) return;  // the line above alone
  std::printf("%-40s %-10s %7s %5s %-22s %16s  %s\n", "case", "scheme", "pass", "ranks", "mask", "memory/rank",
              "status");
  for (size_t i = 0; i < p.cases.size(); ++i) {
    const Case& c = p.cases[i];
    const bool fits = avail_per_rank < 0 || double(p.predicted_bytes[i]) <= avail_per_rank;
    std::printf("%-40s %-10s %7s %5d %-22s %16s  %s\n", c.id.c_str(), c.scheme.c_str(), model::to_string(c.stack.pass),
                c.stack.attn.ranks, c.stack.attn.mask.describe().c_str(),
                hn::human_bytes(double(p.predicted_bytes[i])).c_str(),
                !c.refused.empty() ? ("refused: " + c.refused).c_str()
                : fits             ? "ok"
                                   : "does not fit");
  }
}

}  // namespace

bool predict_only(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--predict" || std::string(argv[i]) == "--advise") return true;
  return false;
}

hn::FabricRequest requested_fabric(int argc, char** argv) {
  if (std::string f = hn::flag_value(argc, argv, "--fabric"); !f.empty()) return {f, "--fabric"};
  std::string from_set, deck = hn::flag_value(argc, argv, "--deck");
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) != "--set") continue;
    try {
      const SetOverride o = parse_set(argv[i + 1]);
      if (o.id() == "run.fabric") from_set = o.value;
    } catch (const UsageError&) {  // the parse step says what is wrong with it
    }
  }
  if (!from_set.empty()) {
    if (from_set.size() >= 2 && from_set.front() == '"' && from_set.back() == '"')
      from_set = from_set.substr(1, from_set.size() - 2);
    return {from_set, "--set run.fabric"};
  }
  if (deck.empty()) return {};
  const std::string f = hn::deck_fabric(deck);
  if (f.empty()) return {};
  return {f, "run.fabric"};
}

// A size with a unit ("80GiB", "1.5 TiB", "512MB"): decimal digits with an optional fraction,
// no sign, exponent or hex; -1 when it is not one.
double parse_size(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i < s.size() && s[i] == '.')
    for (++i; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]));) ++i;
  if (i == 0 || s.find_first_of("0123456789") >= i) return -1;
  const double v = std::strtod(s.substr(0, i).c_str(), nullptr);
  std::string unit = s.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  const std::pair<const char*, double> units[] = {
      {"B", 1},    {"KiB", 0x1p10}, {"MiB", 0x1p20}, {"GiB", 0x1p30}, {"TiB", 0x1p40}, {"PiB", 0x1p50}, {"EiB", 0x1p60},
      {"KB", 1e3}, {"MB", 1e6},     {"GB", 1e9},     {"TB", 1e12},    {"PB", 1e15},    {"EB", 1e18}};
  for (const auto& [u, f] : units)
    if (unit == u) return v * f;
  return -1;
}

std::string scheme_list() {
  std::string s;
  for (const cp::SchemeInfo& info : cp::registry()) {
    std::string problems;
    for (cp::Problem pr : info.problems) problems += std::string(problems.empty() ? "" : ", ") + cp::to_string(pr);
    s += info.name + "  [" + problems + "]\n    " + info.summary + "\n";
    for (const cp::Setting& st : info.settings)
      s += "    setting " + st.name + " (default " + std::to_string(st.default_value) +
           ", >= " + std::to_string(st.min_value) + "): " + st.help + "\n";
    if (info.takes_dispatch) s += "    takes sweep.dispatch (which tokens each rank holds)\n";
    if (!info.refuses.empty()) s += "    refuses: " + info.refuses + "\n";
  }
  return s;
}

namespace {

// The flags that only go with one command, and the commands that exclude each other.
void check_perf_flags(const CLI::App& app, PredictOptions& pf, const Options& o) {
  if (int(pf.calibrate) + int(pf.predict) + int(pf.advise) + int(o.dry_run) > 1)
    throw UsageError("--calibrate, --predict, --advise and --dry-run: one at a time");
  if (!pf.against.empty() && !pf.predict) throw UsageError("--against " + pf.against + ": only with --predict");
  if (app.count("--gpus") && !pf.advise) throw UsageError("--gpus: only with --advise");
  if (app.count("--gpus") && pf.gpus < 1)
    throw UsageError("--gpus " + std::to_string(pf.gpus) + ": must be at least 1");
  for (const char* f : {"--ranks-per-node", "--threads"}) {
    if (app.count(f) == 0) continue;
    if (!pf.predict && !pf.advise) throw UsageError(std::string(f) + ": only with --predict or --advise");
    const int v = std::string(f) == "--threads" ? pf.threads : pf.ranks_per_node;
    if (v < 1) throw UsageError(std::string(f) + " " + std::to_string(v) + ": must be at least 1");
  }
  if (!pf.against.empty()) {
    const std::string unusable = hn::input_file_problem(pf.against, hn::kResultsFile);
    if (!unusable.empty())
      throw UsageError("--against " + pf.against + ": " + unusable +
                       (unusable == "no such file" ? " (a results file minicp wrote with --out)" : ""));
    const std::string why = record::not_a_results_file(pf.against);
    if (!why.empty()) throw UsageError("--against " + pf.against + ": " + why);
    // The layout the file was measured with, unless given.
    if (pf.ranks_per_node == 0) {
      const double rpn = record::read_number_attr(pf.against, "/", "ranks_per_node");
      const double world = record::read_number_attr(pf.against, "/", "world_ranks");
      pf.ranks_per_node = std::isfinite(rpn) && rpn >= 1 ? int(rpn) : std::isfinite(world) ? int(world) : 0;
    }
    if (pf.threads == 0) {
      const double t = record::read_number_attr(pf.against, "/", "kokkos_concurrency");
      pf.threads = std::isfinite(t) && t >= 1 ? int(t) : 0;
    }
  }
}

// --advise --gpus N: the deck's sweep.tp and sweep.ranks become every tp dividing N that
// splits the model and N / tp (make_cases crosses them; run_advise keeps the meshes of N).
void mesh_sweep(Deck& d, int gpus) {
  d.tp.clear(), d.ranks.clear();
  for (int tp = 1; tp <= gpus; ++tp)
    if (gpus % tp == 0 && model::check_tp(d.shape, tp).empty()) d.tp.push_back(tp), d.ranks.push_back(gpus / tp);
  d.dp = {1};
  d.all_schemes = true;  // a scheme that cannot run a mesh is listed refused, not an error
}

// The resolved deck of a results file (for --against without --deck), read into memory: no
// file is written for it.
std::string deck_of_results(const std::string& file) {
  const std::string text = record::read_string_attr(file, "/", "deck");
  if (text.empty()) throw UsageError("--against " + file + ": holds no deck (root attribute 'deck')");
  return text;
}

}  // namespace

bool wants_nccl() {
  const hn::FabricProfile* f = hn::applied_fabric();
  return f && f->communicator == "nccl";
}

namespace {

// A profile that asks for NCCL where this build or node cannot give it is refused before
// anything is allocated, naming the profile and the reason.
void check_communicator(const Plan& p) {
  if (!wants_nccl()) return;
  std::string why = comm::nccl_unavailable(p.topo.local_size);
  if (why.empty() && kernels::kHostMemory)
    why =
        "this build keeps the tensors in host memory (NCCL needs them on the GPU: build with -DMINICP_ENABLE_CUDA=ON "
        "and a CUDA Kokkos)";
  if (!why.empty()) throw UsageError("fabric " + hn::applied_fabric()->name + ": communicator nccl: " + why);
}

}  // namespace

namespace {

// What the command line gives as text or a bare flag, read after parsing.
struct RawFlags {
  std::string rank_memory;  // --rank-memory, a size with a unit
  bool as_json = false;     // --json
};

void declare_flags(CLI::App& app, Options& o, PredictOptions& pf, RawFlags& raw) {
  app.add_option("--deck", o.deck, "input deck (TOML), e.g. inputs/tiny.toml (required; no default)")
      ->type_name("FILE");
  app.add_option("--set", o.sets, "override one deck key: section.key=value (a TOML value), repeatable (default: none)")
      ->type_name("KEY=VALUE");
  app.add_option("--out", o.out, "HDF5 results file (default: the deck's output.file; no file when that is unset)")
      ->type_name("FILE.h5");
  app.add_option("--dump", o.dump,
                 "write the first case's global tensors (x, y, dy, dx, weights, gradients) to this HDF5 file "
                 "(default: no dump)")
      ->type_name("FILE.h5");
  app.add_option("--resume", o.resume,
                 "keep the complete cases of this results file (of the same deck), run the others, and write "
                 "the whole file again (to --out, default: this file) (default: none)")
      ->type_name("FILE.h5");
  app.add_flag("--overwrite", o.overwrite,
               "replace an existing --out or --dump that is not a minicp file of its kind (results, dump); an "
               "input (--deck, the calibration table, --resume, --against) is never replaced (default: off)");
  app.add_flag("--dry-run", o.dry_run,
               "print the resolved cases with the predicted memory per rank and run nothing; exit 2 when a case "
               "would not fit (default: off)");
  app.add_flag("--quiet", o.quiet,
               "print only the summary lines: no per-case rows of a run, --dry-run or --predict (default: off)");
  app.add_flag("--no-events", o.no_events,
               "record no trace events (the events tables stay empty; for measuring the tracing overhead) "
               "(default: off)");
  app.add_option("--fabric", o.fabric,
                 "fabric profile: a name from inputs/fabrics/ or a profile file; its MPI/UCX settings are applied "
                 "before MPI starts and what MPI selects is checked (default: the deck's run.fabric; none: MPI's "
                 "own choice)")
      ->type_name("NAME");
  app.add_option("--rank-memory", raw.rank_memory,
                 "with --dry-run: plan against this much memory per rank (e.g. 80GiB for a GPU node) instead of "
                 "this node's available memory (default: this node's)")
      ->type_name("SIZE");
  app.add_flag("--calibrate", pf.calibrate,
               "measure the performance model's kernel rates (the deck's GEMM shapes, attention tiles at its head_dim, "
               "element-wise kernels, in its run.dtype) and links under this launch, write them to --calibration, run "
               "nothing else (default: off)");
  app.add_option("--calibration", pf.calibration,
                 "calibration table: written by --calibrate (default results/calibration.txt), read by --predict, "
                 "--advise and a run (default for a run: measured at start-up and kept in the results file)")
      ->type_name("FILE");
  app.add_flag("--predict", pf.predict,
               "print the model's step time per case of the deck, at any rank count, in this one process; run "
               "nothing (default: off)");
  app.add_flag("--advise", pf.advise,
               "rank the deck's schemes per pass, seq_len and ranks by predicted step time, with why; run nothing "
               "(default: off)");
  app.add_option("--against", pf.against,
                 "with --predict: a results file whose measured step times the predictions are compared with (its "
                 "deck, ranks per node, threads and calibration table unless given) (default: none)")
      ->type_name("FILE.h5");
  app.add_option("--ranks-per-node", pf.ranks_per_node,
                 "with --predict / --advise: ranks per node (default: all on one node for a local fabric or none, "
                 "the profile's nodes for an emulated one, 8 for a cluster profile)")
      ->type_name("N");
  app.add_option("--gpus", pf.gpus,
                 "with --advise: rank every mesh of N ranks, tp x cp with tp each divisor of N that splits the "
                 "model (its heads, K/V heads and FFN), in place of sweep.tp and sweep.ranks (default: the deck's)")
      ->type_name("N");
  app.add_option("--threads", pf.threads,
                 "with --predict / --advise: threads per rank whose rates the table holds (default: the table's)")
      ->type_name("N");
  app.add_flag("--list-schemes", o.list_schemes,
               "print every scheme: problems, summary, settings, refusals (default: off)");
  app.add_flag("--list-deck-keys", o.list_deck_keys,
               "print every deck key: section, allowed values, default, help (default: off)");
  app.add_flag("--list-figures", o.list_figures,
               "print every figure of a case's summary: unit, range, definition (default: off)");
  app.add_flag("--list-mixes", o.list_mixes,
               "print every named document mix of sweep.documents: name, what it draws (default: off)");
  app.add_flag("--json", raw.as_json, "with a --list-* flag: as one JSON array (default: off)");
}

// The flags against each other (and --list-schemes, which prints and stops); throws
// UsageError or HelpShown.
void check_flags(const CLI::App& app, const hn::Args& a, Options& o, PredictOptions& pf, const RawFlags& raw) {
  const std::pair<const char*, const std::string*> files[] = {
      {"--out", &o.out}, {"--dump", &o.dump}, {"--resume", &o.resume}};
  for (const auto& [flag, path] : files)
    if (app.count(flag) > 0 && path->empty()) throw UsageError(std::string(flag) + " '': needs a file name");
  const int listings = int(o.list_schemes) + int(o.list_deck_keys) + int(o.list_figures) + int(o.list_mixes);
  if (raw.as_json && listings == 0)
    throw UsageError("--json: only with --list-schemes, --list-deck-keys, --list-figures or --list-mixes");
  if (listings > 1) throw UsageError("--list-schemes, --list-deck-keys, --list-figures, --list-mixes: one at a time");
  if (listings == 1) {
    const std::string text = o.list_schemes     ? (raw.as_json ? cp::registry_json(1) : scheme_list())
                             : o.list_deck_keys ? (raw.as_json ? deck_keys_json(1) : deck_keys_help())
                             : o.list_mixes     ? (raw.as_json ? mixes_json(1) : mixes_text())
                                                : (raw.as_json ? figure_catalog_json(1) : figure_catalog_text());
    if (a.rank() == 0) std::printf("%s\n", text.c_str());
    throw hn::HelpShown{};
  }
  if (!raw.rank_memory.empty()) {
    o.rank_memory = parse_size(raw.rank_memory);
    if (o.rank_memory < 0)
      throw UsageError("--rank-memory " + raw.rank_memory +
                       ": expected a size with a unit, digits and an optional fraction (e.g. 80GiB, 512MiB, 1.5TiB; "
                       "units B, KiB .. EiB, KB .. EB)");
    if (o.rank_memory == 0) throw UsageError("--rank-memory " + raw.rank_memory + ": must be more than 0");
    if (o.rank_memory < 1) throw UsageError("--rank-memory " + raw.rank_memory + ": must be at least 1 B");
    if (!o.dry_run)
      throw UsageError("--rank-memory " + raw.rank_memory + ": only with --dry-run (a run uses the node it has)");
  }
  if (hn::has_control_char(o.fabric))
    throw UsageError("--fabric " + o.fabric + ": a profile name or file cannot hold a control character");
  check_perf_flags(app, pf, o);
  if (pf.calibrate && pf.calibration.empty()) pf.calibration = "results/calibration.txt";
  if (!pf.against.empty() && o.deck.empty()) o.deck_text = deck_of_results(pf.against);
  if (o.deck.empty() && o.deck_text.empty())
    throw UsageError("--deck: required (an input deck, e.g. --deck inputs/tiny.toml)");
}

// The deck with --set and --fabric applied (--fabric is the deck's run.fabric, so the resolved
// deck and a resume's check record it), and the calibration table it reads checked against it.
void load_plan_deck(Plan& p, const hn::Args& a, bool predicting) {
  Options& o = p.o;
  const PredictOptions& pf = p.predict_opts;
  std::vector<std::string> sets = o.sets;
  if (!o.fabric.empty()) {
    for (const std::string& s : sets)
      if (parse_set(s).id() == "run.fabric")
        throw UsageError("--fabric " + o.fabric + " with --set " + s + ": give the fabric once");
    sets.push_back("run.fabric=\"" + o.fabric + "\"");
  }
  const bool any_ranks = o.dry_run || predicting;
  if (o.deck_text.empty()) {
    p.deck = load_deck(o.deck, sets, a.size(), any_ranks);
  } else {  // --against's deck: named by its file from here on
    p.deck =
        load_deck_text(o.deck_text, pf.against, "--against " + pf.against + " (its deck)", sets, a.size(), any_ranks);
    o.deck = pf.against;
  }
  if (pf.gpus > 0) mesh_sweep(p.deck, pf.gpus);
  if (const FileArg table = calibration_input(p); !table.path.empty()) {
    try {
      machine_for(p.deck, predict::read_calibration(table.path), 0, 1);
    } catch (const UsageError& e) {
      // machine_for names the table --calibration; here it may be the deck's run.calibration
      const std::string what = e.what(), own = "--calibration ";
      if (table.flag != "--calibration" && what.rfind(own, 0) == 0)
        throw UsageError(table.flag + " " + what.substr(own.size()));
      throw;
    } catch (const std::exception& e) {
      throw UsageError(table.flag + " " + e.what());
    }
  }
}

// The cases and the memory each needs per rank; the case that needs most, for the checks.
std::pair<int64_t, std::string> plan_cases(Plan& p) {
  p.cases = make_cases(p.deck);
  const size_t elem = elem_size(p.deck.dtype);
  int64_t most = 0;
  std::string most_id;
  for (const Case& c : p.cases) {
    const int64_t b = c.refused.empty() ? model::predicted_stack_bytes(c.stack, *c.info, elem) : 0;
    p.predicted_bytes.push_back(b);
    if (b > most) most = b, most_id = c.id;
  }
  return {most, most_id};
}

// --dry-run: the table of cases; with --rank-memory, the verdict against it (HelpShown or
// UsageError); otherwise the run's own memory check follows.
void dry_run_table(const Plan& p, const hn::Args& a, int64_t most, const std::string& most_id,
                   const std::string& rank_memory) {
  const Options& o = p.o;
  const int64_t node = hn::node_available_bytes();
  const double avail = o.rank_memory > 0 ? o.rank_memory : node < 0 ? -1.0 : double(node) / p.topo.local_size;
  if (a.rank() == 0) print_dry_run(p, avail, o.rank_memory > 0);
  std::fflush(stdout);  // the table before any refusal below
  if (o.rank_memory > 0) {
    if (double(most) > o.rank_memory)
      throw UsageError("case " + most_id + " needs " + hn::human_bytes(double(most)) + " per rank, more than " +
                       "--rank-memory " + rank_memory);
    throw hn::HelpShown{};
  }
}

}  // namespace

// Options -> Plan with every check, on every rank alike; throws UsageError.
Plan parse(const hn::Args& a) {
  Plan p;
  Options& o = p.o;
  PredictOptions& pf = p.predict_opts;
  CLI::App app{
      "minicp: Llama-style decoder layers, forward and backward, on every context-parallel scheme, "
      "driven by an input deck (TOML)"};
  RawFlags raw;
  declare_flags(app, o, pf, raw);
  hn::parse(app, a, [] { std::printf("\n%s", deck_keys_help().c_str()); });
  check_flags(app, a, o, pf, raw);
  const bool predicting = pf.predict || pf.advise;
  if (!predicting) p.mpi = hn::verify_fabric(MPI_COMM_WORLD);
  load_plan_deck(p, a, predicting);  // a dry run plans for any job size (a cluster deck on a laptop)
  if (o.out.empty()) {
    o.out = o.resume.empty() ? p.deck.output_file : o.resume;
    o.out_flag = o.resume.empty() ? "output.file" : "--resume";
  }
  const auto [most, most_id] = plan_cases(p);
  p.topo = comm::Communicator::node_topology();
  if (pf.calibrate) claim_outputs(a, p);  // its table, before the measurement
  if (pf.any()) return p;                 // the model's commands (execute) write no results file
  if (o.dry_run) dry_run_table(p, a, most, most_id, raw.rank_memory);
  if (!o.dry_run) check_communicator(p);
  hn::check_memory(a, "case " + most_id, double(most), p.topo.local_size);
  if (o.dry_run) throw hn::HelpShown{};
  claim_outputs(a, p);
  return p;
}

namespace {

// A rank's spot in words: its stage, for a case's stage the case and its rep; then the layer,
// pass and part of the layer it was in (miniapp/model/layer.cpp tells the watchdog).
std::string spot_words(const Plan& p, const hn::Watchdog::Spot& spot) {
  std::string w = stage_words(spot.phase);
  if (stage_of_case(spot.phase) && spot.case_index >= 0 && spot.case_index < int64_t(p.cases.size())) {
    const std::string rep =
        spot.rep >= 0 ? "rep " + std::to_string(spot.rep) : "warm-up rep " + std::to_string(spot.rep + p.deck.warmup);
    w = "in case " + p.cases[size_t(spot.case_index)].id + ", " + (spot.phase == int64_t(Stage::Reps) ? rep : w);
  }
  if (w.empty()) w = "at start-up";
  if (spot.layer < 0) return w;
  w += ", layer " + std::to_string(spot.layer) + (spot.pass == 1 ? " backward" : " forward");
  if (spot.part < 0 || spot.part >= model::kPhases) return w;
  const model::Phase part = model::Phase(spot.part);
  const bool attn = part == model::Phase::AttnCompute;
  return w + " (" + (attn ? "attention" : model::to_string(part)) +
         (attn && spot.step >= 0 ? " step " + std::to_string(spot.step) : "") + ")";
}

// Where a rank was when the stall watchdog ends the job, and what the results file keeps:
// the resumed cases, and in the last round (the only one of run.rounds = 1) every case before
// the one rank 0 is in (a case is written after its last round). results and round: null
// for a job that writes no results file (--calibrate).
hn::Watchdog::Where stall_where(const Plan& p, const std::atomic<record::Results*>* results,
                                const std::atomic<int>* round) {
  return [&p, results, round](const hn::Watchdog::Spot& spot, int64_t root_case) {
    const record::Results* file = results ? results->load() : nullptr;
    const bool last = round && round->load() == p.deck.rounds - 1;
    int kept = 0;
    for (const Case& c : p.cases) kept += (last && c.index < root_case) || (file && file->has_case(c.id)) ? 1 : 0;
    const std::string keeps = file ? "the results file keeps the " + std::to_string(kept) + " complete cases"
                              : results && !p.o.out.empty() ? "the results file not yet opened"
                                                            : "no results file";
    // The stalled rank's last report may name an earlier case than the one the job is in.
    const bool elsewhere = stage_of_case(spot.phase) && spot.case_index >= 0 && root_case >= 0 &&
                           root_case != spot.case_index && root_case < int64_t(p.cases.size());
    const std::string now_at = elsewhere ? " (rank 0 is in case " + p.cases[size_t(root_case)].id + ")" : "";
    return spot_words(p, spot) + now_at + "; ending the job (" + keeps + ")";
  };
}

std::vector<std::string> mode_names() {
  std::vector<std::string> n;
  for (cp::Mode m : all_modes()) n.push_back(cp::to_string(m));
  return n;
}
std::vector<std::string> phase_names() {
  std::vector<std::string> n;
  for (int i = 0; i < model::kPhases; ++i) n.push_back(model::to_string(model::Phase(i)));
  n.push_back("total");
  return n;
}
std::vector<std::string> kind_names() {
  std::vector<std::string> n;
  for (int k = 0; k <= int(comm::EventKind::Kernel); ++k) n.push_back(comm::to_string(comm::EventKind(k)));
  return n;
}

// A bf16 run's attention path, measured (kernels::measure_attention_paths, every rank at once,
// as the cases run) and chosen by rank 0 for every rank, unless MINICP_ATTENTION_ISA forces
// one. Returns rank 0's rates for the record ("" where nothing was measured).
std::string choose_attention_path(const Plan& p) {
  if (p.deck.dtype != "bf16") return "";
  at(Stage::AttentionPaths);
  const std::vector<kernels::AttnPathRate> rates = kernels::measure_attention_paths(p.deck.shape.head_dim);
  if (rates.empty()) return "";
  kernels::set_attention_isa(hn::bcast_string(kernels::fastest_attention_path(rates), MPI_COMM_WORLD));
  return hn::bcast_string(kernels::describe_attention_paths(rates), MPI_COMM_WORLD);
}

// The start-up line, and a warning when the BLAS runs below what the CPU offers.
void print_startup(const hn::Args& a, const Plan& p, const hn::BlasInfo& blas, double sgemm, size_t done) {
  const std::string dtype = p.deck.dtype == "bf16" ? "bf16 (GEMMs: " + kernels::gemm_bf16_engine() +
                                                         ", attention: " + kernels::attention_isa() + ")"
                                                   : p.deck.dtype;
  std::printf("minicp: %s, %zu cases, %d ranks x %d threads, %s, BLAS %s, SGEMM %.1f GFLOP/s per rank%s\n",
              hn::printable(p.o.deck).c_str(), p.cases.size(), a.size(), int(kernels::Exec().concurrency()),
              dtype.c_str(), blas.summary().c_str(), sgemm / 1e9,
              done ? (", resuming: " + std::to_string(done) + " cases done").c_str() : "");
  // The fabric line: what was asked for and what MPI selected (nodes, PML, BTLs).
  const hn::FabricProfile* f = hn::applied_fabric();
  std::printf("minicp: fabric %s, %d node%s, MPI pml %s%s\n",
              f ? hn::printable(f->name).c_str() : "(none: MPI's defaults)", p.topo.nodes, p.topo.nodes == 1 ? "" : "s",
              p.mpi.pml.empty() ? p.mpi.how.c_str() : p.mpi.pml.c_str(),
              p.mpi.pml == "ob1" ? (", btls " + p.mpi.btl_list()).c_str() : "");
  std::fflush(stdout);
}

// Events onto rank 0's clock (the offsets measured at the start and now, interpolated);
// sets the bound of the alignment on summary (rank 0). Collective.
void align_events(const hn::ClockSync& clock0, std::vector<record::EventRow>& events, record::Attrs& summary) {
  hn::ClockModel clock{clock0, hn::measure_offset(MPI_COMM_WORLD)};
  for (record::EventRow& e : events) e.t_begin = clock.to_root(e.t_begin), e.t_end = clock.to_root(e.t_end);
  double err[2] = {clock.uncertainty_s(), std::abs(clock.drift())};  // the worst rank's
  MPI_Allreduce(MPI_IN_PLACE, err, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  summary.real["clock_uncertainty_s"] = err[0];  // of the events' t_begin / t_end
  summary.real["clock_drift"] = err[1];          // |d offset / d t|, dimensionless
}

// The communicator of a case's mesh: its job is the first tp x cp x dp ranks and, where the
// mesh has TP or DP, its world this rank's CP group (the ranks past the job get a group of
// their own, which they leave unused). NCCL where the fabric profile asks for it
// (check_communicator has refused what cannot run), else MPI, staging device tensors through
// host memory unless MPI is GPU-aware.
std::unique_ptr<comm::Communicator> case_comm(const ProgressSettings& prog, const comm::Mesh& mesh, int world_rank) {
  const int n = mesh.ranks();
  std::unique_ptr<comm::Communicator> c =
      wants_nccl() ? comm::make_nccl_comm(n, kernels::compute_stream())
                   : comm::make_mpi_comm(prog.progress, prog.poll_us, {}, comm::staging_for(kernels::kHostMemory), n);
  if (!mesh.id().empty() && world_rank < n) c->narrow_world(mesh.color(c->job().rank, comm::Axis::CP));
  return c;
}

// Everything one run keeps across its cases.
struct RunState {
  RunState(const hn::Args& args, const Plan& plan) : a(args), p(plan) {
    prog.progress = comm::parse_progress(p.deck.progress);
  }
  const hn::Args& a;
  const Plan& p;
  ProgressSettings prog;
  hn::ClockSync clock0;
  CeilingCache ceiling;
  NoneTimes none;
  std::atomic<record::Results*> results{nullptr};  // (the stall watchdog reads it)
  predict::Machine model;  // the performance model's machine (the table, this job's links and layout)
  std::vector<predict::LayerTime> layer_samples;  // the layer rows measured again in each round (rank 0)
  double write_s = 0;
  std::string summary;        // the tokens of the closing MINICP line
  std::atomic<int> round{0};  // the round in progress (run.rounds; the stall watchdog reads it)
};

// One round of one case, measured on its group (the other ranks wait); after its last round
// the figures on rank 0 and one transaction. A refused case is written in the first round.
void run_one(RunState& rs, const Case& c, int round, CaseResult& run) {
  const int world_rank = rs.a.rank(), job = c.stack.mesh.ranks();
  record::CaseRecord& rec = run.record;
  rec.id = c.id;
  if (!c.documents.empty()) rec.document_lengths = c.stack.attn.mask.doc_lengths(c.stack.attn.seq_len);
  rec.mode_names = mode_names(), rec.phase_names = phase_names(), rec.kind_names = kind_names();
  if (!c.refused.empty()) {
    if (round > 0) return;
    rec.attrs = case_attrs(c, rs.p.deck, rs.p.topo);
    if (world_rank == 0 && !rs.p.o.quiet) std::printf("  refused: %s\n", c.refused.c_str());
    if (record::Results* file = rs.results) rs.write_s += file->add_case(rec);
    return;
  }
  auto comm = case_comm(rs.prog, c.stack.mesh, world_rank);
  comm->trace().set_enabled(false);
  const std::string dump = &c == &rs.p.cases.front() ? rs.p.o.dump : "";  // --dump: the first case
  if (world_rank < job) measure_case(rs.p, c, *comm, dump, rs.ceiling, run, round);
  MPI_Barrier(MPI_COMM_WORLD);
  if (round < rs.p.deck.rounds - 1) return;
  at(Stage::Gathering);
  rec.attrs = case_attrs(c, rs.p.deck, comm->topology());
  align_events(rs.clock0, rec.events, rec.summary);
  if (world_rank == 0) {
    const double clock_err = rec.summary.real["clock_uncertainty_s"], drift = rec.summary.real["clock_drift"];
    rec.summary = figures(c, run, rs.none, int(kernels::Exec().concurrency()));
    rec.summary.real["clock_uncertainty_s"] = clock_err, rec.summary.real["clock_drift"] = drift;
    rec.attrs.text["start_time"] = run.start_utc, rec.attrs.text["end_time"] = run.end_utc;
    if (c.scheme == std::string("none")) rs.none[none_key(c)] = rec.summary.real["measured_time_s"];
    model::PhaseTimes phases = run.fwd_phases;
    phases += run.bwd_phases;
    prediction_figures(rec.summary, c, rs.model, rs.p.deck, phases.s, rec.summary.real["sgemm_flops_per_s"]);
  }
  at(Stage::Writing);
  if (record::Results* file = rs.results) rs.write_s += file->add_case(rec);
  if (world_rank != 0) return;
  rs.summary += " " + report_case(c, rec.summary, run, rs.p.o.quiet);
}

}  // namespace

namespace {

// The performance model of this run: the --calibration table, else one measured now on this
// job (the deck's shapes, every rank at once, this fabric's links); the job's layout.
predict::Machine start_model(const hn::Args& a, const Plan& p, comm::Communicator& world) {
  predict::Calibration cal;
  const std::string from = !p.predict_opts.calibration.empty() ? p.predict_opts.calibration : p.deck.calibration;
  if (from.empty()) {
    cal.source = "none";
    return predict::Machine{cal, {}, {}, 1, 1, {}};
  }
  if (from != "measure") {
    cal = predict::read_calibration(from);
  } else {
    if (a.rank() == 0 && !p.o.quiet)
      std::printf("minicp: calibrating the performance model (run.calibration = \"measure\")\n");
    std::fflush(stdout);
    at(Stage::Calibrating);
    cal = predict::measure_calibration(calibration_plan(p.deck, p.cases, p.topo.local_size), world, false);
    measure_layer_rows(p, world, cal);
    cal.source = "measured at start-up";
    cal.of_the_run = true;
  }
  try {
    return machine_for(p.deck, cal, int(kernels::Exec().concurrency()), p.topo.local_size);
  } catch (const std::exception& e) {  // e.g. a table of other thread counts: no prediction, said once
    if (a.rank() == 0) std::fprintf(stderr, "minicp: WARNING: no predictions: %s\n", e.what());
    predict::Calibration none;
    none.source = from + " (unusable: " + e.what() + ")";
    return predict::Machine{none, {}, {}, 1, 1, {}};
  }
}

// A run's layer rows, measured again (one piece each) at the start of each round after the
// first. The host's speed drifts by up to 30% from minute to minute, and a layer's over its
// own GEMMs with it (one fabric's rows read 1.03x in one run and 1.17-1.22x in the next; a
// decode step, streaming the weights from memory, 3.8-5.0 ms per layer over three runs where
// its cases read 11.9-12.0 ms a step). The cases' reps are spread over the rounds; so are the
// rows' samples, and each row becomes the median of the start-up row and the rounds'
// (predict::median_layer_rows), in place before the last round's cases are predicted. The
// file's table is written again at the end.
void measure_layer_rows_again(RunState& rs, comm::Communicator& world, int round) {
  const Plan& p = rs.p;
  if (round == 0 || rs.model.cal.source != "measured at start-up") return;
  if (rs.a.rank() == 0 && !p.o.quiet) std::printf("minicp: measuring the layer rows again (round %d)\n", round + 1);
  std::fflush(stdout);
  at(Stage::LayerRows);
  predict::Calibration again;
  measure_layer_rows(p, world, again, 1);
  if (rs.a.rank() != 0) return;
  rs.layer_samples.insert(rs.layer_samples.end(), again.layers.begin(), again.layers.end());
  if (round < p.deck.rounds - 1) return;
  std::vector<predict::LayerTime> all = rs.model.cal.layers;
  all.insert(all.end(), rs.layer_samples.begin(), rs.layer_samples.end());
  rs.model.cal.layers = predict::median_layer_rows(all);
  rs.model.cal.info.push_back({"layer_rows_rounds", std::to_string(p.deck.rounds)});
}

}  // namespace

namespace {

// --predict, --advise (rank 0; nothing else runs) or --calibrate (every rank, watched).
int run_predict_command(const hn::Args& a, const Plan& p) {
  if (a.rank() == 0 && p.predict_opts.predict) run_predict(p);
  if (a.rank() == 0 && p.predict_opts.advise) run_advise(p);
  if (p.predict_opts.calibrate) {
    hn::Watched watched(MPI_COMM_WORLD, p.deck.stall_timeout_s, stall_where(p, nullptr, nullptr), a.prog());
    choose_attention_path(p);  // the table's bf16 attention rows are of the path a run takes
    at(Stage::Calibrate);
    run_calibrate(a, p, *comm::make_mpi_comm(comm::Progress::None));
    watched.stop();
  }
  std::fflush(stdout);
  return 0;
}

// run.rounds: every round runs each case still to do in turn; a case's rows wait in `runs`
// for its last round. Returns the seconds the rounds took.
double run_rounds(RunState& rs, const std::vector<const Case*>& todo, comm::Communicator& world, bool say) {
  const int R = rs.p.deck.rounds;
  std::vector<const Case*> all_rounds;
  for (int r = 0; r < R; ++r) all_rounds.insert(all_rounds.end(), todo.begin(), todo.end());
  std::vector<CaseResult> runs(R > 1 ? todo.size() : 1);
  Eta eta(rs.p, all_rounds);
  const double t_start = MPI_Wtime();
  for (int round = 0; round < R; ++round) {
    rs.round = round;
    measure_layer_rows_again(rs, world, round);
    for (size_t i = 0; i < todo.size(); ++i) {
      const double elapsed = MPI_Wtime() - t_start;
      const std::string left = eta.start(*todo[i], elapsed);
      const std::string of_rounds = R > 1 ? "round " + std::to_string(round + 1) + "/" + std::to_string(R) + ", " : "";
      if (say)
        std::printf("[%zu/%zu] %s (%selapsed %.1f s%s)\n", i + 1, todo.size(), todo[i]->id.c_str(), of_rounds.c_str(),
                    elapsed, left.c_str());
      std::fflush(stdout);
      hn::Watchdog::instance().progress(todo[i]->index, -1, int64_t(Stage::SettingUp));
      CaseResult& run = runs[R > 1 ? i : 0];
      run_one(rs, *todo[i], round, run);
      if (R == 1 || round == R - 1) run = CaseResult{};  // written: its rows are freed
    }
  }
  return MPI_Wtime() - t_start;
}

// The closing lines (rank 0): the grep-able MINICP summary, and where the results went.
void print_end(const Plan& p, const RunState& rs, const hn::BlasInfo& blas, double sgemm, double run_s,
               bool said_file) {
  std::printf("MINICP deck=%s cases=%zu run_s=%.1f sgemm_gflops=%.1f blas_core=%s layer_efficiency:%s\n",
              hn::printable(p.o.deck).c_str(), p.cases.size(), run_s, sgemm / 1e9,
              blas.core.empty() ? "unknown" : blas.core.c_str(), rs.summary.c_str());
  if (said_file)
    std::printf("minicp: results in %s (writing took %.3f s, %.2f%% of the run)\n", hn::printable(p.o.out).c_str(),
                rs.write_s, 100.0 * rs.write_s / run_s);
  else if (!p.o.quiet)
    std::printf("minicp: no results file written (the deck has no [output] file; --out FILE.h5 writes one)\n");
}

// What a stop by a signal says (rank 0, which holds the outputs' locks): how to finish.
void say_on_stop(const hn::Args& a, const Plan& p) {
  if (a.rank() != 0) return;
  std::string after = " (the output locks are removed)";
  if (!p.o.out.empty() && !p.predict_opts.any())
    after = "; the output lock is removed and the complete cases are kept in " + hn::printable(p.o.out) +
            ": run the same command with --resume " + hn::printable(p.o.out) + " to finish";
  hn::on_stop_signal(a.prog() + ": stopped by ", after);
}

}  // namespace

int execute(const hn::Args& a, const Plan& p) {
  say_on_stop(a, p);
  if (p.predict_opts.any()) return run_predict_command(a, p);
  const bool say = a.rank() == 0 && !p.o.quiet;
  RunState rs(a, p);
  std::unique_ptr<record::Results> results;  // outlives the watchdog, which reads it
  // Watched from before the run's first collective (the deck's limit is known once parsed).
  hn::Watched watched(MPI_COMM_WORLD, p.deck.stall_timeout_s, stall_where(p, &rs.results, &rs.round), a.prog());
  at(Stage::StartUp);
  hn::MemTracker::instance().start();
  if (p.o.resume.empty()) hn::remove_old_outputs(a, {{"--out", p.o.out}, {"--dump", p.o.dump}});
  for (const std::string& f : {p.o.out, p.o.dump})  // this run holds their locks: no live run wrote these
    if (a.rank() == 0 && !f.empty()) record::remove_stale_temporaries(f);
  rs.none = p.resumed_none_time;  // cases resumed after their `none` keep cp_efficiency_core_scaled
  // Staged as the cases' MPI communicator is, so that its backend() names theirs.
  auto world = comm::make_mpi_comm(comm::Progress::None, 50, {}, comm::staging_for(kernels::kHostMemory));
  at(Stage::Clocks);
  rs.clock0 = hn::measure_offset(MPI_COMM_WORLD);
  const hn::BlasInfo blas = hn::blas_info();
  // The start-up reading over the whole job: reported, and the first case of as many ranks
  // reuses it while it is fresh.
  at(Stage::Ceiling);
  hn::Watchdog::instance().test_stop("ceiling");
  double sgemm = rs.ceiling.get(MPI_COMM_WORLD, a.size(), {}).rates.blas_square;
  MPI_Allreduce(MPI_IN_PLACE, &sgemm, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  sgemm /= a.size();
  const std::string paths = choose_attention_path(p);
  record::Attrs root = platform_attrs(a, p, *world, blas, rs.prog);
  root.real["sgemm_flops_per_s_per_rank"] = sgemm;
  root.text["attention_paths"] = paths;
  rs.model = start_model(a, p, *world);
  root.text["calibration"] = rs.model.cal.text();
  root.text["calibration_source"] = rs.model.cal.source;
  at(Stage::OpeningFile);
  if (!p.o.out.empty())
    results = std::make_unique<record::Results>(p.o.out, MPI_COMM_WORLD, root, p.o.resume, p.deck.resolved);
  rs.results = results.get();
  if (say) print_startup(a, p, blas, sgemm, results ? results->done().size() : 0);
  if (a.rank() == 0 && !blas.warning.empty()) std::fprintf(stderr, "minicp: WARNING: %s\n", blas.warning.c_str());
  std::vector<const Case*> todo;
  for (const Case& c : p.cases)
    if (!(results && results->has_case(c.id))) todo.push_back(&c);
  const double run_s = run_rounds(rs, todo, *world, say);
  at(Stage::Finishing);
  if (results) {
    record::Attrs end;
    end.text["end_time"] = iso_time_utc();
    end.real["run_time_s"] = run_s;
    end.real["results_write_time_s"] = rs.write_s;
    end.text["calibration"] = rs.model.cal.text();  // the layer rows of every round (rank 0's)
    results->finish(end);
  }
  watched.stop();
  hn::MemTracker::instance().stop();
  if (a.rank() == 0) print_end(p, rs, blas, sgemm, run_s, say && results);
  return 0;
}

}  // namespace minicp::run
