// The files of a minicp run, checked and claimed in the parse step, before any work (see
// claim_outputs in driver.hpp). Rank 0 looks at the file system and holds the locks; every
// rank gets its verdict (harness::check_on_root), so bad input ends the job with one message.
#include <sys/stat.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "harness/output.hpp"
#include "miniapp/output/dump.hpp"
#include "miniapp/output/h5.hpp"
#include "miniapp/output/results.hpp"
#include "miniapp/run/driver.hpp"

namespace minicp::run {
namespace {

namespace hn = minicp::harness;

struct Named {
  std::string flag, path;
  bool input;  // never replaced, even with --overwrite
};

// An output must not be an input, nor the other output, under another spelling ("r.h5" and
// "./r.h5", a link): the run would destroy the input, or write one file twice at once.
std::string same_file_problem(const Options& o) {
  const Named out{"--out", o.out, false}, dump{"--dump", o.dump, false}, deck{"--deck", o.deck, true},
      resume{"--resume", o.resume, true};
  const std::pair<Named, Named> pairs[] = {{out, deck}, {dump, deck}, {dump, resume}, {dump, out}};
  for (const auto& [a, b] : pairs)
    if (hn::same_file(a.path, b.path))
      return a.flag + " " + a.path + ": the same file as " + b.flag + " " + b.path +
             (b.input ? " (an input is never overwritten, not even with --overwrite)" : "") + "; give " + a.flag +
             " another name";
  return "";
}

// Rank 0 takes the lock of each output before anything looks at or removes the outputs.
std::string lock_outputs(const hn::Args& a, const Options& o, Plan& p) {
  for (const Named& n : {Named{"--out", o.out, false}, Named{"--dump", o.dump, false}}) {
    if (n.path.empty()) continue;
    auto lock = std::make_shared<hn::OutputLock>();
    const std::string why = lock->take(a.prog(), n.flag, n.path);
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

bool readable(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f) std::fclose(f);
  return f != nullptr;
}

// An existing output of another kind (a text file, another program's HDF5 file, a dump given
// as --out) is replaced only with --overwrite. A minicp file of the right kind is replaced as
// documented; the --resume file is checked as an input (resume_problem).
std::string kind_problem(const Options& o) {
  if (o.overwrite) return "";
  const std::string out_kind = o.resume.empty() || !hn::same_file(o.out, o.resume) ? o.out : "";
  const std::pair<Named, std::string (*)(const std::string&)> outs[] = {
      {{"--out", out_kind, false}, output::not_a_results_file}, {{"--dump", o.dump, false}, output::not_a_dump_file}};
  for (const auto& [n, problem] : outs) {
    if (!exists(n.path)) continue;
    const std::string why = problem(n.path);
    if (!why.empty())
      return n.flag + " " + n.path + ": exists and is not a minicp " + (n.flag == "--out" ? "results" : "dump") +
             " file (" + why + "); choose another " + n.flag + ", or give --overwrite to replace it";
  }
  return "";
}

// --resume: a readable minicp results file of this very deck, checked here so that a wrong
// file is bad input (not an abort after the run started). Keeps what the file tells the run:
// the times of its `none` cases (for cp_efficiency_core_scaled of the cases still to run).
std::string resume_problem(const Plan& p, std::map<std::string, double>& none_time) {
  const Options& o = p.o;
  const std::string at = "--resume " + o.resume + ": ";
  if (!readable(o.resume)) return at + "no such file or not readable";
  const std::string why = output::not_a_results_file(o.resume);
  if (!why.empty()) return at + "not a minicp results file (" + why + "); give the results file of a run of this deck";
  try {
    if (output::read_string_attr(o.resume, "/", "deck") != p.deck.resolved)
      return at + "the file was written by another deck (its resolved deck differs from this run's)";
    for (const output::StoredCase& c : output::stored_cases(o.resume)) {
      if (!o.dump.empty() && !p.cases.empty() && c.id == p.cases.front().id)
        return "--dump " + o.dump + " with --resume " + o.resume + ": the first case (" + c.id +
               "), the one --dump writes, is complete in the file and would not run again; dump without --resume";
      if (c.scheme == "none") none_time[c.pass + "_" + std::to_string(c.seq_len)] = c.measured_time_s;
    }
  } catch (const std::runtime_error& e) {
    return at + "cannot be read: " + e.what();
  }
  return "";
}

}  // namespace

void claim_outputs(const hn::Args& a, Plan& p) {
  hn::check_on_root(a, [&] {
    std::string why = same_file_problem(p.o);
    if (why.empty()) why = lock_outputs(a, p.o, p);
    if (why.empty()) why = kind_problem(p.o);
    if (why.empty() && !p.o.resume.empty()) why = resume_problem(p, p.resumed_none_time);
    if (!why.empty()) p.locks.clear();  // a refused run leaves nothing behind, lock files included
    return why;
  });
}

}  // namespace minicp::run
