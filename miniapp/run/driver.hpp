// The minicp driver: parse (command line -> deck -> cases, with every check before any work)
// and execute (each case: build the layer stack on its CP group, time its reps, print its
// table, dump the first case). miniapp/main.cpp only wires these into harness::main.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/fabric.hpp"
#include "harness/lock.hpp"
#include "harness/main.hpp"
#include "miniapp/run/deck.hpp"
#include "miniapp/run/perf_cmds.hpp"

namespace minicp::run {

struct Options {
  std::string deck;
  std::vector<std::string> sets;
  std::string out, dump, resume;
  bool dry_run = false, quiet = false, list_schemes = false, no_events = false;
  bool overwrite = false;  // an existing --out / --dump of another kind may be replaced
  std::string fabric;      // --fabric: a profile name or file ("" none; the deck's run.fabric otherwise)
  double rank_memory = -1; // --rank-memory: bytes per rank a dry run plans against (-1: this node's)
};

struct Plan {
  Options o;
  Deck deck;
  std::vector<Case> cases;
  std::vector<int64_t> predicted_bytes;  // per case, per rank (the memory model)
  int local_ranks = 1;                   // ranks of the job on this node
  int nodes = 1;                         // nodes (distinct host names) of the job
  harness::MpiSelection mpi;             // what MPI selected (checked against the fabric profile)
  // Rank 0: the locks of --out and --dump, held for the whole run (see claim_outputs).
  std::vector<std::shared_ptr<harness::OutputLock>> locks;
  // Rank 0, --resume: measured_time_s of the file's complete `none` cases by "<pass>_<S>".
  std::map<std::string, double> resumed_none_time;
  PerfOptions perf;  // --calibrate, --predict, --advise and their settings
};

// Throws harness::UsageError on bad input; prints and throws harness::HelpShown for --help,
// --list-schemes and --dry-run (which refuses, with UsageError, a case that would not fit).
Plan parse(const harness::Args& a);
// The files of the run, once the plan is known (miniapp/run/files.cpp;
// docs/results-file.md): refuses (UsageError) an output that is an input under another name, an output in use
// by another run, an existing output of another kind (unless --overwrite), and a --resume
// file that is not a results file of this deck; then holds the outputs' locks in p.locks.
void claim_outputs(const harness::Args& a, Plan& p);
int execute(const harness::Args& a, const Plan& p);

// Whether the command line asks for a prediction only (--predict, --advise): no fabric is
// applied and nothing runs.
bool predict_only(int argc, char** argv);

// Before MPI_Init: the fabric profile the command line asks for: --fabric, else
// --set run.fabric=NAME, else the deck's run.fabric (a deck that cannot be read asks for none:
// parse() reports it).
harness::FabricRequest requested_fabric(int argc, char** argv);

// A size with a unit ("80GiB", "512MiB", "1.5TiB", "80GB"), in bytes (0 for "0GiB": the caller
// says it is too small); -1 when malformed.
double parse_size(const std::string& s);

// The registry, for --list-schemes: name, problems, summary, settings, refusals.
std::string scheme_list();

}  // namespace minicp::run
