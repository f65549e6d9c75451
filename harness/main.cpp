// The MPI + Kokkos main wrapper and its single error mapping (guarded); see main.hpp.
#include "harness/main.hpp"

#include "harness/blas.hpp"
#include "harness/watchdog.hpp"

#include <mpi.h>

#include <Kokkos_Core.hpp>
#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime_api.h>
#endif
#include <algorithm>
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

std::string printable(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c != 0x7f) {
      out += ch;
      continue;
    }
    const char* named = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : nullptr;
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    out += named ? named : hex;
  }
  return out;
}

bool has_control_char(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
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
    if (a.rank() == 0) std::fprintf(stderr, "%s: %s\n", a.prog().c_str(), printable(e.what()).c_str());
    std::fflush(stderr);
    return 2;
  } catch (const AgreedError& e) {
    if (a.rank() == e.reporter) std::fprintf(stderr, "%s: %s\n", a.prog().c_str(), printable(e.what()).c_str());
    std::fflush(stderr);
    Watchdog::instance().stop();  // collective, and every rank is here: its thread must not outlive MPI
    return 1;
  } catch (const JobError& e) {
    if (a.mpi() && a.rank() != e.reporter) {
      std::this_thread::sleep_for(std::chrono::seconds(30));  // the reporter's abort ends us first
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fatal = printable(e.what()), once = true;
  } catch (const std::exception& e) {
    fatal = printable(e.what());
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

// A thread count: a whole number from 1 to kMaxThreads, else -1.
int thread_count(const std::string& v) {
  if (v.empty() || v.size() > 6 || v.find_first_not_of("0123456789") != std::string::npos) return -1;
  const int n = std::atoi(v.c_str());
  return n >= 1 && n <= kMaxThreads ? n : -1;
}

// Kokkos' own flags (--kokkos-num-threads=N, ...; always one "--kokkos-x=value" word) are
// kept apart, so the program's parser never sees them and Kokkos sees only them.
void split_args(int argc, char** argv, std::vector<std::string>& own, std::vector<std::string>& kokkos) {
  own.assign(1, argc > 0 ? argv[0] : "");
  kokkos = own;
  for (int i = 1; i < argc; ++i) (std::strncmp(argv[i], "--kokkos-", 9) == 0 ? kokkos : own).push_back(argv[i]);
}

std::string& startup_error() {
  static std::string why;
  return why;
}

// How long a rank whose parse failed waits for the others to finish theirs (see agree_parse).
constexpr double kAgreeWait_s = 10;

// The parse step's verdict, agreed by every rank: kContinue, 0 (help shown) or 2 (bad input).
// A check can fail on one rank only (a file or a variable only it sees), so every rank's
// verdict goes through a non-blocking all-reduce over `agreement`, a duplicate of
// MPI_COMM_WORLD that no collective of parse uses, and the lowest failing rank prints its
// message once. A rank that failed cannot wait for ever: another may be blocked inside a
// collective of parse that the failed rank never enters. After kAgreeWait_s it prints its
// message and ends the job with exit code 2.
int agree_parse(const Args& a, MPI_Comm agreement, bool help, const std::string& why) {
  int v[2] = {why.empty() ? a.size() : a.rank(), help ? 0 : 1};  // first failing rank; any help
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Iallreduce(MPI_IN_PLACE, v, 2, MPI_INT, MPI_MIN, agreement, &req);
  const auto start = std::chrono::steady_clock::now();
  for (int done = 0;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) break;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!why.empty() && waited > kAgreeWait_s) {
      std::fprintf(stderr, "%s (rank %d): %s\n", a.prog().c_str(), a.rank(), printable(why).c_str());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the others may be parsing on these cores
  }
  if (v[0] < a.size()) {
    if (a.rank() == v[0]) std::fprintf(stderr, "%s: %s\n", a.prog().c_str(), printable(why).c_str());
    std::fflush(stderr);
    return 2;
  }
  return v[1] == 0 ? 0 : kContinue;
}

// The parse step: kContinue, or the exit code. Any other error than bad input aborts the job
// (guarded).
int parse_step(const Args& a, MPI_Comm agreement, std::vector<std::string>& kokkos_args, const ParseFn& parse) {
  bool help = false;
  std::string why;
  const int rc = guarded(a, [&] {
    try {
      if (!startup_error().empty()) throw UsageError(startup_error());
      check_thread_request(kokkos_args);
      if (const std::string gpu = gpu_problem(); !gpu.empty()) throw UsageError(gpu);
      parse(a);
    } catch (const HelpShown&) {
      help = true;
    } catch (const UsageError& e) {
      why = e.what();
      if (why.empty()) why = "bad input";
    }
    return kContinue;
  });
  if (rc != kContinue) return rc;
  if (a.mpi()) return agree_parse(a, agreement, help, why);
  if (!why.empty()) std::fprintf(stderr, "%s: %s\n", a.prog().c_str(), printable(why).c_str());
  return !why.empty() ? 2 : help ? 0 : kContinue;
}

// Parse, then run inside a Kokkos::ScopeGuard. Errors of run are caught while Kokkos is
// still up (an abort does not wait for Kokkos to finalise).
int parse_then_run(const Args& a, MPI_Comm agreement, std::vector<std::string> kokkos_args, const ParseFn& parse,
                   const RunFn& run) {
  const int rc = parse_step(a, agreement, kokkos_args, parse);
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
  MPI_Comm agreement = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &agreement);
  Args a(prog, own, rank, size, true);
  a.set_kokkos_args({kokkos.begin() + 1, kokkos.end()});
  const int rc = parse_then_run(a, agreement, kokkos, parse, run);
  MPI_Comm_free(&agreement);
  MPI_Finalize();
  return rc;
}

int main_serial(int argc, char** argv, const char* prog, const ParseFn& parse, const RunFn& run) {
  select_blas_core(argv);
  std::vector<std::string> own, kokkos;
  split_args(argc, argv, own, kokkos);
  Args a(prog, own, 0, 1, false);
  a.set_kokkos_args({kokkos.begin() + 1, kokkos.end()});
  return parse_then_run(a, MPI_COMM_NULL, kokkos, parse, run);
}

void set_startup_error(const std::string& why) { startup_error() = why; }

std::string gpu_problem() {
#if defined(KOKKOS_ENABLE_CUDA)
  // Kokkos' CUDA start-up aborts on a node without a usable GPU (a driver stub, no device):
  // asked here first, it is one message on every rank's terms instead.
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess)
    return std::string("no usable GPU on this node (CUDA: ") + cudaGetErrorString(e) +
           "): this build keeps its tensors on the GPU; run it on a GPU node, or use the host build";
  if (n == 0) return "no GPU on this node: this build keeps its tensors on the GPU; run it on a GPU node";
#endif
  return "";
}

void check_thread_request(std::vector<std::string>& kokkos_args) {
  const std::string range = ": must be a whole number of threads per rank from 1 to " + std::to_string(kMaxThreads);
  if (const char* e = std::getenv("OMP_NUM_THREADS"); e && thread_count(e) < 0)
    throw UsageError(std::string("OMP_NUM_THREADS=") + e + range);
  // This Kokkos' spelling of the thread flag; the other one is read as the same flag.
  const std::string own = KOKKOS_VERSION < 40000 ? "--kokkos-threads" : "--kokkos-num-threads";
  for (std::string& w : kokkos_args) {
    for (const std::string flag : {"--kokkos-threads", "--kokkos-num-threads"}) {
      if (w != flag && w.rfind(flag + "=", 0) != 0) continue;
      const std::string v = w.size() > flag.size() ? w.substr(flag.size() + 1) : "";
      if (thread_count(v) < 0) throw UsageError(flag + "=" + v + range);
      w = own + "=" + v;
      break;
    }
  }
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
