// The files of a minicp run, checked and claimed in the parse step, before any work (see
// claim_outputs in driver.hpp). Rank 0 looks at the file system and holds the locks; every
// rank gets its verdict (harness::check_on_root), so bad input ends the job with one message.
#include <mpi.h>
#include <sys/stat.h>

#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "harness/fabric.hpp"
#include "harness/input.hpp"
#include "harness/output.hpp"
#include "harness/toml.hpp"
#include "miniapp/predict/calibration.hpp"
#include "miniapp/record/dump.hpp"
#include "miniapp/record/h5.hpp"
#include "miniapp/record/results.hpp"
#include "miniapp/run/driver.hpp"
#include "miniapp/run/figures.hpp"

namespace minicp::run {
namespace {

namespace hn = minicp::harness;

// The files this run writes: the table of --calibrate, else --out and --dump (a prediction
// writes none).
std::vector<FileArg> outputs_of(const Plan& p) {
  if (p.predict_opts.calibrate) return {{"--calibration", p.predict_opts.calibration}};
  if (p.predict_opts.any()) return {};
  return {{p.o.out_flag, p.o.out}, {"--dump", p.o.dump}};
}

// The files this run reads. --calibrate reads the table it writes (to keep its other rows): it
// is the output there, checked as a table (table_problem). A fabric profile is read before MPI
// starts (harness::applied_fabric), from --fabric or the deck's run.fabric.
std::vector<FileArg> inputs_of(const Plan& p) {
  const hn::FabricProfile* fabric = hn::applied_fabric();
  return {{"--deck", p.o.deck},
          calibration_input(p),
          {"--resume", p.o.resume},
          {"--against", p.predict_opts.against},
          {p.o.fabric.empty() ? "run.fabric" : "--fabric", fabric ? fabric->path : ""}};
}

// An output must not be an input, nor another output, under another spelling ("r.h5" and
// "./r.h5", a link): the run would destroy the input, or write one file twice at once. The
// --out of a --resume is its file by default: that one output rewrites its input, case by case.
std::string same_file_problem(const Plan& p) {
  const std::vector<FileArg> outs = outputs_of(p), ins = inputs_of(p);
  for (size_t i = 0; i < outs.size(); ++i) {
    const FileArg& o = outs[i];
    for (const FileArg& in : ins)
      if (!(o.flag != "--dump" && in.flag == "--resume") && hn::same_file(o.path, in.path))
        return o.flag + " " + o.path + ": the same file as " + in.flag + " " + in.path +
               " (an input is never overwritten, not even with --overwrite); give " + o.flag + " another name";
    for (size_t j = 0; j < i; ++j)
      if (hn::same_file(o.path, outs[j].path))
        return o.flag + " " + o.path + ": the same file as " + outs[j].flag + " " + outs[j].path + "; give " + o.flag +
               " another name";
  }
  return "";
}

// Each output can be written (harness::output_path_problem: a regular file of one name, or
// nothing yet, in a writable directory).
std::string path_problem(const Plan& p) {
  for (const FileArg& f : outputs_of(p)) {
    const std::string why = f.path.empty() ? "" : hn::output_path_problem(f.flag, f.path);
    if (!why.empty()) return why;
  }
  return "";
}

// Rank 0 takes the lock of each output before anything looks at or removes the outputs.
std::string lock_outputs(const hn::Args& a, Plan& p) {
  for (const FileArg& f : outputs_of(p)) {
    if (f.path.empty()) continue;
    auto lock = std::make_shared<hn::OutputLock>();
    const std::string why = lock->take(a.prog(), f.flag, f.path);
    if (!why.empty()) return why;
    p.locks.push_back(lock);
  }
  return "";
}

// Existing at all (even unreadable: what cannot be read cannot be told a minicp file either).
bool exists(const std::string& path) {
  struct stat st {};
  return !path.empty() && ::stat(path.c_str(), &st) == 0;
}

// An existing output of another kind (a text file, another program's HDF5 file, a dump given
// as --out) is replaced only with --overwrite. A minicp file of the right kind is replaced as
// documented; the --resume file is checked as an input (resume_problem).
std::string kind_problem(const Options& o) {
  if (o.overwrite) return "";
  const std::string out_kind = o.resume.empty() || !hn::same_file(o.out, o.resume) ? o.out : "";
  const std::pair<FileArg, std::string (*)(const std::string&)> outs[] = {
      {{o.out_flag, out_kind}, record::not_a_results_file}, {{"--dump", o.dump}, record::not_a_dump_file}};
  for (const auto& [n, problem] : outs) {
    if (!exists(n.path)) continue;
    const std::string why = problem(n.path);
    if (!why.empty())
      return n.flag + " " + n.path + ": exists and is not a minicp " + (n.flag == "--dump" ? "dump" : "results") +
             " file (" + why + "); choose another " + n.flag + ", or give --overwrite to replace it";
  }
  return "";
}

// Each value of a resolved deck by "section.key", written as TOML (harness::format_toml).
std::map<std::string, std::string> deck_values(const std::string& toml) {
  std::map<std::string, std::string> out;
  for (const auto& [section, table] : hn::parse_toml(toml).table)
    for (const auto& [key, value] : table.table) out[section + "." + key] = hn::format_toml(value);
  return out;
}

// Where two resolved decks differ: the first key whose value differs, with both values.
std::string first_difference(const std::string& theirs, const std::string& ours) {
  const auto a = deck_values(theirs), b = deck_values(ours);
  std::set<std::string> keys;
  for (const auto& kv : a) keys.insert(kv.first);
  for (const auto& kv : b) keys.insert(kv.first);
  for (const std::string& k : keys) {
    const auto x = a.find(k), y = b.find(k);
    const std::string in_file = x == a.end() ? "not set" : x->second, in_run = y == b.end() ? "not set" : y->second;
    if (in_file != in_run) return k + " is " + in_file + " in the file and " + in_run + " in this run";
  }
  return "the resolved decks differ in their layout";
}

// --resume: a readable minicp results file of this very deck, checked here so that a wrong
// file is bad input (not an abort after the run started). Keeps what the file tells the run:
// the times of its `none` cases (for cp_efficiency_core_scaled of the cases still to run), and
// whether it is finished with every case already.
std::string resume_problem(Plan& p, bool& complete) {
  const Options& o = p.o;
  const std::string at = "--resume " + o.resume + ": ";
  const std::string why = record::not_a_results_file(o.resume);
  if (!why.empty()) return at + "not a minicp results file (" + why + "); give the results file of a run of this deck";
  try {
    const std::string theirs = record::read_string_attr(o.resume, "/", "deck");
    if (theirs != p.deck.resolved)
      return at + "the file was written by another deck (" + first_difference(theirs, p.deck.resolved) + ")";
    std::set<std::string> stored;
    for (const record::StoredCase& c : record::stored_cases(o.resume)) {
      if (!o.dump.empty() && !p.cases.empty() && c.id == p.cases.front().id)
        return "--dump " + o.dump + " with --resume " + o.resume + ": the first case (" + c.id +
               "), the one --dump writes, is complete in the file and would not run again; dump without --resume";
      if (c.scheme == "none")
        p.resumed_none_time[none_key(c.pass, c.seq_len, c.decode_tokens, c.documents_label)] = c.measured_time_s;
      stored.insert(c.id);
    }
    // Finished as well: a run stopped after its last case but before its end record is resumed
    // to write that record (else the file would read as partial for ever).
    complete = record::read_string_attr(o.resume, "/", "complete") == "yes";
    for (const Case& c : p.cases) complete = complete && stored.count(c.id) > 0;
  } catch (const std::runtime_error& e) {
    return at + "cannot be read: " + e.what();
  }
  return "";
}

// --calibrate keeps the rows of an existing table that it does not measure again: an existing
// file that is no table is refused now, not after the measurement.
std::string table_problem(const std::string& path) {
  if (!exists(path)) return "";
  try {
    predict::read_calibration(path);
  } catch (const std::exception& e) {
    return "--calibration " + path + ": exists and is not a calibration table (" + e.what() + ")";
  }
  return "";
}

// What each output path names when it is a symbolic link (harness::output_target): the run
// locks and writes that file, and the link stays. Looked at by rank 0, for every rank.
void follow_output_links(const hn::Args& a, Plan& p) {
  const std::vector<std::string*> outs = p.predict_opts.calibrate
                                             ? std::vector<std::string*>{&p.predict_opts.calibration}
                                             : std::vector<std::string*>{&p.o.out, &p.o.dump};
  for (std::string* path : outs)
    *path = hn::bcast_string(a.rank() == 0 && !path->empty() ? hn::output_target(*path) : *path, MPI_COMM_WORLD);
}

// The checks every claim starts with: the inputs are files, no output is an input, each output
// can be written; then the outputs' locks.
std::string common_problem(const hn::Args& a, Plan& p) {
  // --resume first: its file is also the default --out, whose checks would otherwise name --out.
  std::string why = p.o.resume.empty() ? "" : hn::input_file_problem(p.o.resume, hn::kResultsFile);
  if (!why.empty()) return "--resume " + p.o.resume + ": " + why;
  why = same_file_problem(p);
  if (why.empty()) why = path_problem(p);
  if (why.empty()) why = lock_outputs(a, p);
  return why;
}

}  // namespace

FileArg calibration_input(const Plan& p) {
  if (p.predict_opts.calibrate) return {"--calibration", ""};
  if (!p.predict_opts.calibration.empty()) return {"--calibration", p.predict_opts.calibration};
  return {"run.calibration", p.deck.calibration == "measure" ? "" : p.deck.calibration};
}

void claim_outputs(const hn::Args& a, Plan& p) {
  follow_output_links(a, p);
  bool complete = false;
  hn::check_on_root(a, [&] {
    std::string why = common_problem(a, p);
    if (why.empty() && p.predict_opts.calibrate) why = table_problem(p.predict_opts.calibration);
    if (why.empty() && !p.predict_opts.any()) why = kind_problem(p.o);
    if (why.empty() && !p.o.resume.empty()) why = resume_problem(p, complete);
    if (!why.empty()) p.locks.clear();  // a refused run leaves nothing behind, lock files included
    return why;
  });
  int done = complete ? 1 : 0;
  MPI_Bcast(&done, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!done) return;
  // A resume that would run nothing changes nothing: no new run record, no copy to --out.
  if (a.rank() == 0)
    std::printf("minicp: every case of %s is complete; nothing to run%s\n", p.o.resume.c_str(),
                hn::same_file(p.o.out, p.o.resume) ? "" : (" (--out " + p.o.out + " is not written)").c_str());
  std::fflush(stdout);
  p.locks.clear();
  throw hn::HelpShown{};
}

}  // namespace minicp::run
