// minicp-fidelity: the error of every CP scheme in fp32 and bf16 against fp64 on the same
// inputs, at this MPI job's rank count, beside the single-rank `none` of the same precision
// (miniapp/fidelity/fidelity.hpp). One JSON file per job; `make fidelity-study` runs it at
// P = 1, 2, 3, 4, 6, 8 and joins the files.
//
// main is: parse (every check, the output path), run (every scheme x mask x head layout, at
// both levels; cases a scheme refuses at this P are listed as skipped) and write.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "harness/cli.hpp"
#include "harness/main.hpp"
#include "harness/output.hpp"
#include "kernels/attention.hpp"
#include "kernels/gemm.hpp"
#include "miniapp/cp/scheme.hpp"
#include "miniapp/fidelity/fidelity.hpp"

namespace {
using namespace minicp;
namespace hn = minicp::harness;
using hn::UsageError;

// The file_kind of the JSON this program writes: an existing --out without it is another
// program's file, replaced only with --overwrite.
const char* const kFileKind = "minicp fidelity";

struct Plan {
  std::string schemes = "all", masks = hn::join_list(cp::Mask::kind_names()), levels = "attention,layer", out;
  bool overwrite = false;  // --overwrite: an existing --out of another kind may be replaced
  int64_t seq_len = 384;
  int heads = 24, head_dim = 64, hidden = 768, ffn = 2048, layers = 2;
  std::vector<int64_t> kv_heads = {24, 6};
  std::vector<std::string> scheme_list, mask_list, level_list;
};

// Each of list in allowed, else UsageError naming the flag, the value and what is allowed.
void check_each(const std::string& flag, const std::vector<std::string>& list,
                const std::vector<std::string>& allowed) {
  std::string words;
  for (const auto& w : allowed) words += (words.empty() ? "" : ", ") + w;
  for (const auto& x : list)
    if (std::find(allowed.begin(), allowed.end(), x) == allowed.end())
      throw UsageError(flag + " " + x + ": not one of " + words);
  if (list.empty()) throw UsageError(flag + ": needs at least one of " + words);
}

Plan g_plan;

// One case of the table: a scheme at one level (attention or layer), mask and K/V head count,
// with the shape that level runs (attention: --head-dim; layer: --hidden / --heads).
struct TableCase {
  std::string scheme, level;
  cp::Mask mask;
  model::Shape shape;
};

// The table's cases in the order it is written; the layer level only for schemes that train.
std::vector<TableCase> table_cases(const Plan& p) {
  std::vector<TableCase> out;
  for (const std::string& scheme : p.scheme_list)
    for (const cp::Mask& mask : cp::Mask::examples(p.seq_len)) {
      if (std::find(p.mask_list.begin(), p.mask_list.end(), mask.name()) == p.mask_list.end()) continue;
      for (int64_t kv : p.kv_heads)
        for (const std::string& level : p.level_list) {
          if (level == "layer" && !cp::find(scheme).solves(cp::Problem::Train)) continue;
          const int head_dim = level == "layer" ? p.hidden / p.heads : p.head_dim;
          out.push_back({scheme, level, mask, {p.hidden, p.heads, int(kv), head_dim, p.ffn, p.layers, 10000, 1e-5}});
        }
    }
  return out;
}

// A table with no row is refused before any work, as minicp refuses a case that cannot run:
// the first refusal says why.
void check_some_case_runs(const Plan& p, int ranks) {
  std::string first;
  for (const TableCase& c : table_cases(p)) {
    const std::string why = fidelity::refusal(c.scheme, c.mask, c.level, p.seq_len, c.shape, ranks);
    if (why.empty()) return;
    if (first.empty()) first = c.level + " " + c.scheme + " " + c.mask.name() + ": " + why;
  }
  throw UsageError("--seq-len " + std::to_string(p.seq_len) + " at " + std::to_string(ranks) +
                   " ranks: no case of the table can run (" + (first.empty() ? "no case selected" : first) + ")");
}

void parse(const hn::Args& a) {
  Plan& p = g_plan;
  CLI::App app{"minicp-fidelity: fp32 and bf16 error of every CP scheme against fp64, at this job's ranks", a.prog()};
  std::vector<std::string> names = {"all"};
  for (const auto& s : cp::registry()) names.push_back(s.name);
  app.add_option("--schemes", p.schemes, "comma list of schemes, or all")->capture_default_str();
  app.add_option("--masks", p.masks,
                 "comma list of " + hn::join_list(cp::Mask::kind_names()) + " (window, documents: of S/4 tokens)")
      ->capture_default_str();
  app.add_option("--levels", p.levels, "attention (one call: O, LSE, dQ, dK, dV), layer (a train step of the stack)")
      ->capture_default_str();
  hn::add_int(app, "--seq-len", p.seq_len, 1, 1 << 20, "global tokens S (divisible by 2P for zigzag)");
  hn::add_int(app, "--heads", p.heads, 1, 1 << 12, "query heads H (attention and layer)");
  hn::add_int_list(app, "--kv-heads", p.kv_heads, 1, 1 << 12, "key/value head counts to measure (each divides H)");
  hn::add_int(app, "--head-dim", p.head_dim, 2, 1024, "attention level: head dimension D (even)");
  hn::add_int(app, "--hidden", p.hidden, 2, 1 << 16, "layer level: hidden size C (head_dim = C / H)");
  hn::add_int(app, "--ffn", p.ffn, 1, 1 << 20, "layer level: MLP width F");
  hn::add_int(app, "--layers", p.layers, 1, 64, "layer level: decoder layers L");
  app.add_option("--out", p.out, "the JSON file (rank 0; required)")->required();
  app.add_flag("--overwrite", p.overwrite,
               "replace an existing --out that is not a minicp fidelity table (default: off)");
  app.footer("Exit status: 0 ok, 2 bad command line.");
  hn::parse(app, a);
  if (const std::string e = kernels::attention_isa_error(); !e.empty()) throw UsageError(e);
  p.scheme_list = hn::split_list(p.schemes), p.mask_list = hn::split_list(p.masks),
  p.level_list = hn::split_list(p.levels);
  check_each("--schemes", p.scheme_list, names);
  if (p.scheme_list == std::vector<std::string>{"all"}) p.scheme_list.assign(names.begin() + 1, names.end());
  check_each("--masks", p.mask_list, cp::Mask::kind_names());
  check_each("--levels", p.level_list, {"attention", "layer"});
  if (p.head_dim % 2) throw UsageError("--head-dim " + std::to_string(p.head_dim) + ": must be even");
  for (int64_t kv : p.kv_heads)
    if (p.heads % kv)
      throw UsageError("--kv-heads " + std::to_string(kv) + ": must divide --heads " + std::to_string(p.heads));
  if (p.hidden % p.heads || (p.hidden / p.heads) % 2)
    throw UsageError("--hidden " + std::to_string(p.hidden) + ": must be --heads (" + std::to_string(p.heads) +
                     ") times an even head_dim");
  if (p.seq_len < 4) throw UsageError("--seq-len " + std::to_string(p.seq_len) + ": must be >= 4");
  check_some_case_runs(p, a.size());
  hn::check_outputs(a, {{"--out", p.out, "a minicp fidelity table", hn::json_file_kind(kFileKind)}}, p.overwrite);
}

hn::Json to_json(const fidelity::Row& r) {
  return hn::Json{{"level", r.level},
                  {"scheme", r.scheme},
                  {"mask", r.mask},
                  {"variant", r.variant},
                  {"tensor", r.tensor},
                  {"ranks", r.ranks},
                  {"heads", r.heads},
                  {"kv_heads", r.kv_heads},
                  {"head_dim", r.head_dim},
                  {"seq_len", r.seq_len},
                  {"rel_fro", r.rel_fro},
                  {"max_rel", r.max_rel},
                  {"none_rel_fro", r.none_rel_fro},
                  {"none_max_rel", r.none_max_rel}};
}

int run(const hn::Args& a) {
  const Plan& p = g_plan;
  const int P = a.size();
  hn::remove_old_outputs(a, {{"--out", p.out}});
  auto comm = comm::make_mpi_comm(comm::Progress::Thread);
  hn::Json rows = hn::Json::array(), skipped = hn::Json::array();
  for (const TableCase& c : table_cases(p)) {
    std::vector<fidelity::Row> got;
    try {
      got = c.level == "attention" ? fidelity::attention_rows(c.scheme, c.mask, p.seq_len, c.shape.heads,
                                                              c.shape.kv_heads, c.shape.head_dim, *comm)
                                   : fidelity::layer_rows(c.scheme, c.mask, p.seq_len, c.shape, *comm);
    } catch (const std::invalid_argument& refused) {  // the scheme's check at this P: the same on every rank
      skipped.push_back({{"level", c.level},
                         {"scheme", c.scheme},
                         {"mask", c.mask.name()},
                         {"kv_heads", c.shape.kv_heads},
                         {"why", refused.what()}});
      continue;
    }
    for (const auto& r : got) rows.push_back(to_json(r));
    if (a.rank() == 0) {
      double worst = 0;
      for (const auto& r : got)
        if (r.variant == std::string("bf16") && r.none_rel_fro > 0) worst = std::max(worst, r.rel_fro / r.none_rel_fro);
      std::printf("minicp-fidelity P=%d %-10s %-9s kv_heads %-3lld %-9s bf16 worst ratio to none %.2f\n", P,
                  c.scheme.c_str(), c.mask.name(), (long long)c.shape.kv_heads, c.level.c_str(), worst);
      std::fflush(stdout);
    }
  }
  if (a.rank() == 0) {
    hn::Json doc{{"file_kind", kFileKind},
                 {"ranks", P},
                 {"gemm_bf16_engine", kernels::gemm_bf16_engine()},
                 {"attention_isa", kernels::attention_isa()},
                 {"scheme_registry", hn::Json::parse(cp::registry_json())},
                 {"rows", rows},
                 {"skipped", skipped}};
    hn::write_json("--out", p.out, doc);
    std::printf("minicp-fidelity: %zu rows, %zu cases skipped, wrote %s\n", rows.size(), skipped.size(), p.out.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return hn::main(argc, argv, "minicp-fidelity", parse, run); }
