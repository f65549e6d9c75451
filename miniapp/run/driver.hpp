// The minicp driver: parse (command line -> deck -> cases, with every check before any work)
// and execute (each case: build the layer stack on its CP group, time its reps, print its
// table, dump the first case). miniapp/main.cpp only wires these into harness::main.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "harness/fabric.hpp"
#include "harness/lock.hpp"
#include "harness/main.hpp"
#include "miniapp/run/deck.hpp"
#include "miniapp/run/predict_cmds.hpp"

namespace minicp::run {

struct Options {
  std::string deck;
  std::string deck_text;  // --against without --deck: the results file's deck, held in memory
  std::vector<std::string> sets;
  std::string out, dump, resume;
  std::string out_flag = "--out";  // what named out: --out, or the deck's output.file
  bool dry_run = false, quiet = false, list_schemes = false, no_events = false;
  bool list_deck_keys = false, list_figures = false, list_mixes = false;
  bool overwrite = false;   // an existing --out / --dump of another kind may be replaced
  std::string fabric;       // --fabric: a profile name or file ("" none; the deck's run.fabric otherwise)
  double rank_memory = -1;  // --rank-memory: bytes per rank a dry run plans against (-1: this node's)
};

struct Plan {
  Options o;
  Deck deck;
  std::vector<Case> cases;
  std::vector<int64_t> predicted_bytes;  // per case, per rank (the memory model)
  comm::Topology topo;                   // the job's nodes and this rank's node, computed once here
  harness::MpiSelection mpi;             // what MPI selected (checked against the fabric profile)
  // Rank 0: the locks of the outputs, held for the whole run (see claim_outputs).
  std::vector<std::shared_ptr<harness::OutputLock>> locks;
  // Rank 0, --resume: measured_time_s of the file's complete `none` cases by none_key.
  std::map<std::string, double> resumed_none_time;
  PredictOptions predict_opts;  // --calibrate, --predict, --advise and their settings
};

// Throws harness::UsageError on bad input; prints and throws harness::HelpShown for --help,
// --list-schemes, --dry-run (which refuses, with UsageError, a case that would not fit) and a
// --resume whose file holds every case already.
Plan parse(const harness::Args& a);

// A file named on the command line (or in the deck): the flag or key as the user gave it.
struct FileArg {
  std::string flag, path;  // path "": none
};
// The calibration table a run or a prediction reads from a file: --calibration, else the
// deck's run.calibration (path "" when there is none, when it is "measure", and under
// --calibrate, which writes the table).
FileArg calibration_input(const Plan& p);

// The files of the run (a run's --out and --dump, or the table of --calibrate), once the plan
// is known (miniapp/run/files.cpp; docs/results-file.md). Outputs that are symbolic links are
// replaced in p by the files they name. Refuses (UsageError) an input that is no regular file
// (--resume), an output that is an input (or the other output) under another name even with
// --overwrite, an output that cannot be written or has other names (hard links), an output in
// use by another run, an existing output of another kind (unless --overwrite; a --calibrate
// table: no table), and a --resume file that is not a results file of this deck; then holds
// the outputs' locks in p.locks. A --resume file that already holds every case is left as it
// is: one line says so and HelpShown is thrown (exit 0).
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

// Whether the schemes' exchanges go through NCCL: the applied fabric profile's communicator key.
bool wants_nccl();

}  // namespace minicp::run
