// The MPI + Kokkos main wrapper and its single error mapping (guarded); see main.hpp.
#include "harness/main.hpp"

#include "harness/blas.hpp"
#include "harness/watchdog.hpp"

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

namespace minicp::harness {

Args::Args(std::string prog, std::vector<std::string> args, int rank, int size, bool mpi)
    : prog_(std::move(prog)), args_(std::move(args)), rank_(rank), size_(size), mpi_(mpi) {
  for (const std::string& s : args_) ptrs_.push_back(s.c_str());
}

namespace {

constexpr int kContinue = -1;  // guarded(parse) succeeded: go on to run

// The one place errors become messages and exit codes (main.hpp). Returns fn's value, 0
// after --help, 2 after a UsageError; aborts the MPI job (or returns 1 without MPI) on
// anything else; 1 after an AgreedError, on every rank.
int guarded(const Args& a, const std::function<int()>& fn) {
  std::string fatal;
  bool once = false;  // a JobError: printed by its reporting rank alone, without a rank number
  try {
    return fn();
  } catch (const HelpShown&) {
    return 0;
  } catch (const UsageError& e) {
    if (a.rank() == 0) std::fprintf(stderr, "%s: %s\n", a.prog().c_str(), e.what());
    std::fflush(stderr);
    return 2;
  } catch (const AgreedError& e) {
    if (a.rank() == e.reporter) std::fprintf(stderr, "%s: %s\n", a.prog().c_str(), e.what());
    std::fflush(stderr);
    Watchdog::instance().stop();  // collective, and every rank is here: its thread must not outlive MPI
    return 1;
  } catch (const JobError& e) {
    if (a.mpi() && a.rank() != e.reporter) {
      std::this_thread::sleep_for(std::chrono::seconds(30));  // the reporter's abort ends us first
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fatal = e.what(), once = true;
  } catch (const std::exception& e) {
    fatal = e.what();
  } catch (...) {
    fatal = "unknown exception";
  }
  if (a.mpi()) {
    if (once)
      std::fprintf(stderr, "%s: %s\n", a.prog().c_str(), fatal.c_str());
    else
      std::fprintf(stderr, "%s (rank %d): %s\n", a.prog().c_str(), a.rank(), fatal.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  } else {
    std::fprintf(stderr, "%s: %s\n", a.prog().c_str(), fatal.c_str());
  }
  return 1;
}

// Kokkos' own flags (--kokkos-num-threads=N, ...; always one "--kokkos-x=value" word) are
// kept apart, so the program's parser never sees them and Kokkos sees only them.
void split_args(int argc, char** argv, std::vector<std::string>& own, std::vector<std::string>& kokkos) {
  own.assign(1, argc > 0 ? argv[0] : "");
  kokkos = own;
  for (int i = 1; i < argc; ++i) (std::strncmp(argv[i], "--kokkos-", 9) == 0 ? kokkos : own).push_back(argv[i]);
}

// Parse, then run inside a Kokkos::ScopeGuard. Errors of run are caught while Kokkos is
// still up (an abort does not wait for Kokkos to finalise).
int parse_then_run(const Args& a, std::vector<std::string> kokkos_args, const ParseFn& parse, const RunFn& run) {
  const int rc = guarded(a, [&] {
    parse(a);
    return kContinue;
  });
  if (rc != kContinue) return rc;
  std::vector<char*> kargv;
  for (std::string& s : kokkos_args) kargv.push_back(s.data());
  kargv.push_back(nullptr);
  int kargc = int(kokkos_args.size());
  // Kokkos's OpenMP backend warns, once per rank, when OMP_PROC_BIND is unset. The OpenMP
  // runtime read its environment when it was loaded, and with OMP_PROC_BIND and OMP_PLACES
  // unset it does not bind (libgomp, libomp): "false" says what runs, and it is what the
  // run's environment attribute records. A value the user set is left as it is.
  if (std::getenv("OMP_PROC_BIND") == nullptr && std::getenv("OMP_PLACES") == nullptr)
    setenv("OMP_PROC_BIND", "false", 0);
  Kokkos::ScopeGuard kokkos(kargc, kargv.data());
  return guarded(a, [&] { return run(a); });
}

}  // namespace

int main(int argc, char** argv, const char* prog, const ParseFn& parse, const RunFn& run) {
  select_blas_core(argv);  // before anything starts: it may re-execute the program
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<std::string> own, kokkos;
  split_args(argc, argv, own, kokkos);
  const int rc = parse_then_run(Args(prog, own, rank, size, true), kokkos, parse, run);
  MPI_Finalize();
  return rc;
}

int main_serial(int argc, char** argv, const char* prog, const ParseFn& parse, const RunFn& run) {
  select_blas_core(argv);
  std::vector<std::string> own, kokkos;
  split_args(argc, argv, own, kokkos);
  return parse_then_run(Args(prog, own, 0, 1, false), kokkos, parse, run);
}

void check_on_root(const Args& a, const std::function<std::string()>& check) {
  std::string msg = a.rank() == 0 ? check() : std::string();
  if (a.mpi()) msg = bcast_string(msg, MPI_COMM_WORLD);
  if (!msg.empty()) throw UsageError(msg);
}

std::string bcast_string(std::string s, MPI_Comm comm, int root) {
  int64_t n = int64_t(s.size());
  MPI_Bcast(&n, 1, MPI_INT64_T, root, comm);
  s.resize(size_t(n));
  if (n > 0) MPI_Bcast(s.data(), int(n), MPI_CHAR, root, comm);
  return s;
}

void agree(const std::string& why, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int first = why.empty() ? size : rank;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == size) return;
  int reporter = 0;  // in MPI_COMM_WORLD, where guarded() compares it
  MPI_Comm_rank(MPI_COMM_WORLD, &reporter);
  MPI_Bcast(&reporter, 1, MPI_INT, first, comm);
  throw AgreedError(bcast_string(why, comm, first), reporter);
}

}  // namespace minicp::harness
