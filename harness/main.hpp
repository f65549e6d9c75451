// The main of every miniCP program, so that bad input is handled the same way everywhere:
// the program's parse step (options -> config and every check, output paths and memory
// included) runs before Kokkos starts and before any work, and one function maps what it
// throws to a message and an exit code.
//
//   UsageError (bad input)    -> "<prog>: <message>" on stderr from the lowest rank that threw
//                                it; every rank returns 2 (after MPI_Finalize). Parse's
//                                verdicts are agreed by every rank, so a check that fails on
//                                one rank alone (a file or variable only it sees) ends the job
//                                too; facts only one rank should look at go through
//                                check_on_root().
//   --help                    -> parse() prints the help on rank 0; exit code 0; Kokkos is
//                                never initialised, so the help lists the program's options.
//   AgreedError               -> a failure every rank agreed on at one point (agree()):
//                                "<prog>: <what>" from its reporting rank only; every rank
//                                unwinds (its temporaries go, the output locks are released),
//                                stops the stall watchdog and returns 1 (after MPI_Finalize).
//   JobError                  -> a failure every rank was told about: "<prog>: <what>" from
//                                its reporting rank only, which then calls MPI_Abort.
//   any other std::exception  -> "<prog> (rank r): <what>" and MPI_Abort(MPI_COMM_WORLD, 1),
//                                so one failed rank ends the whole job at once.
#pragma once
#include <mpi.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace minicp::harness {

// Bad input: the message names the flag as typed, the value and what is allowed.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A failure that one rank saw and every rank learnt (e.g. through a broadcast), thrown on every
// rank with the same text so that the job reports it once: `reporter` (a rank of
// MPI_COMM_WORLD) prints it and aborts the job; the other ranks wait for that abort rather
// than end the job before the message is out (they abort themselves after 30 s).
struct JobError : std::runtime_error {
  explicit JobError(const std::string& what, int reporter = 0) : std::runtime_error(what), reporter(reporter) {}
  int reporter;
};

// A failure that every rank throws at the same point of the program, with nothing collective
// left in flight (no rank is inside a collective call that another has left), so that the
// job can end cleanly rather than abort: `reporter` prints it, every rank returns 1. Made by
// agree(); the same text on every rank.
struct AgreedError : JobError {
  using JobError::JobError;
};

// s with every control character escaped ("\\n", "\\x1b"): a path or name from the user or
// a file is printed through it, so that it can neither move the terminal nor forge a line.
std::string printable(const std::string& s);
// Whether s holds a control character (what printable escapes).
bool has_control_char(const std::string& s);

// The most threads per rank a run may ask for (OMP_NUM_THREADS, --kokkos-threads,
// --kokkos-num-threads): Kokkos 3.4's OpenMP backend crashes when its thread pool is torn down
// at 1024.
constexpr int kMaxThreads = 512;

// Checks the thread count the environment and Kokkos' flags ask for, and spells the thread
// flag as this Kokkos knows it (3.x: --kokkos-threads, 4.x: --kokkos-num-threads); throws
// UsageError naming the variable or flag, its value and the range.
void check_thread_request(std::vector<std::string>& kokkos_args);

// "" where this build can start (a CUDA build: a usable GPU), else why not. Checked at the
// start of the parse step, agreed by every rank like bad input (exit code 2).
std::string gpu_problem();

// Thrown by parse() once the help has been printed: the program ends with exit code 0.
struct HelpShown {};

// The command line a program parses and where it runs.
class Args {
 public:
  Args(std::string prog, std::vector<std::string> args, int rank, int size, bool mpi);
  const std::string& prog() const { return prog_; }
  // The program's own arguments, argv[0] first; Kokkos' --kokkos-* arguments are taken out
  // (they go to Kokkos::initialize).
  const std::vector<std::string>& args() const { return args_; }
  // The --kokkos-* words as given (for the record of the command line).
  const std::vector<std::string>& kokkos_args() const { return kokkos_; }
  void set_kokkos_args(std::vector<std::string> k) { kokkos_ = std::move(k); }
  int argc() const { return int(ptrs_.size()); }
  const char* const* argv() const { return ptrs_.data(); }
  int rank() const { return rank_; }  // in MPI_COMM_WORLD; 0 under main_serial
  int size() const { return size_; }  // ranks of MPI_COMM_WORLD; 1 under main_serial
  bool mpi() const { return mpi_; }   // false under main_serial (MPI is not initialised)

 private:
  std::string prog_;
  std::vector<std::string> args_;
  std::vector<const char*> ptrs_;
  std::vector<std::string> kokkos_;
  int rank_, size_;
  bool mpi_;
};

// parse: options -> the program's config, every check; throws UsageError (or HelpShown).
// run: the work, with Kokkos initialised; returns the exit code. Everything Kokkos that run
// creates must be destroyed when it returns (Kokkos is finalised right after).
using ParseFn = std::function<void(const Args&)>;
using RunFn = std::function<int(const Args&)>;

// MPI programs: MPI_Init_thread(MPI_THREAD_MULTIPLE), parse, Kokkos::ScopeGuard, run,
// MPI_Finalize; returns the exit code for main to return.
int main(int argc, char** argv, const char* prog, const ParseFn& parse, const RunFn& run);

// Single-process programs that do not use MPI: the same steps and the same error mapping
// without MPI (an unexpected exception prints "<prog>: <what>" and returns 1).
int main_serial(int argc, char** argv, const char* prog, const ParseFn& parse, const RunFn& run);

// A failure found before MPI started (the fabric profile), raised as bad input at the start
// of the parse step, so that every rank agrees on it and it is printed once.
void set_startup_error(const std::string& why);

// Runs check on rank 0 only and makes its answer every rank's: a non-empty message throws
// UsageError(message) on every rank. For what only rank 0 sees (the file system where it
// writes its outputs).
void check_on_root(const Args& a, const std::function<std::string()>& check);

// Rank root's s on every rank of comm. Collective.
std::string bcast_string(std::string s, MPI_Comm comm, int root = 0);

// Collective over comm: `why` is this rank's failure ("" when none). When any rank has one,
// every rank throws AgreedError with the message of the lowest such rank, which reports it;
// otherwise it returns on every rank.
void agree(const std::string& why, MPI_Comm comm);

}  // namespace minicp::harness
