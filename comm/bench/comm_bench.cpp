// minicp-comm-bench: p2p latency/bandwidth and collective busbw of the miniCP Communicator
// (so the backend is what is measured), in the manner of nccl-tests and OSU: a size sweep
// per op, a table per op, one MINICP_COMM summary line per op, optional JSON.
#include <mpi.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/comm.hpp"

namespace {
namespace mc = minicp::comm;

enum class Op { PingPong, SendRecv, AllToAll, AllGather, ReduceScatter, AllReduce };
struct OpInfo {
  Op op;
  const char* name;
  bool p2p;
  bool chunked;  // size = whole buffer, split into one chunk per rank (nccl-tests convention)
};
constexpr OpInfo kOps[] = {
    {Op::PingPong, "pingpong", true, false},     {Op::SendRecv, "sendrecv", true, false},
    {Op::AllToAll, "alltoall", false, true},     {Op::AllGather, "allgather", false, true},
    {Op::ReduceScatter, "reduce_scatter", false, true}, {Op::AllReduce, "allreduce", false, false},
};
constexpr size_t kElem = sizeof(float);
constexpr uint64_t kMaxBytes = uint64_t(2) << 30;

std::string all_op_names() {
  std::string s;
  for (const auto& o : kOps) s += (s.empty() ? "" : ",") + std::string(o.name);
  return s;
}

// nccl-tests bus-bandwidth factors.
double bus_factor(Op op, int n) {
  switch (op) {
    case Op::AllReduce: return 2.0 * (n - 1) / n;
    case Op::AllGather:
    case Op::ReduceScatter:
    case Op::AllToAll: return double(n - 1) / n;
    case Op::SendRecv:
    case Op::PingPong: return 1.0;
  }
  return 1.0;
}
const char* factor_text(Op op) {
  switch (op) {
    case Op::AllReduce: return "2(n-1)/n";
    case Op::AllGather:
    case Op::ReduceScatter:
    case Op::AllToAll: return "(n-1)/n";
    default: return "1";
  }
}

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "8", "256K", "64M", "1G" (binary multiples, case-insensitive, optional trailing B or iB).
uint64_t parse_size(const std::string& flag, const std::string& v) {
  const std::string allowed = "a byte count such as 8, 4096, 256K, 64M or 1G (K, M, G = 2^10, 2^20, 2^30), at most 2G";
  size_t i = 0;
  while (i < v.size() && std::isdigit(static_cast<unsigned char>(v[i]))) ++i;
  if (i == 0 || i > 12) throw UsageError(flag + " '" + v + "': expected " + allowed);
  uint64_t n = std::stoull(v.substr(0, i));
  std::string suf = v.substr(i);
  for (auto& ch : suf) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  uint64_t mult = 1;
  if (!suf.empty() && (suf[0] == 'K' || suf[0] == 'M' || suf[0] == 'G')) {
    mult = suf[0] == 'K' ? (1ull << 10) : suf[0] == 'M' ? (1ull << 20) : (1ull << 30);
    suf.erase(0, 1);
    if (suf == "IB") suf = "B";
  }
  if (!(suf.empty() || suf == "B")) throw UsageError(flag + " '" + v + "': expected " + allowed);
  if (n > kMaxBytes / mult) throw UsageError(flag + " '" + v + "': too large; expected " + allowed);
  return n * mult;
}

int parse_int(const std::string& flag, const std::string& v, int lo, int hi, const std::string& allowed) {
  size_t pos = 0;
  long long x = 0;
  bool ok = !v.empty() && v.size() <= 10 && (std::isdigit(static_cast<unsigned char>(v[0])) || v[0] == '-');
  if (ok) {
    try {
      x = std::stoll(v, &pos);
    } catch (const std::exception&) {
      ok = false;
    }
  }
  if (!ok || pos != v.size() || x < lo || x > hi) throw UsageError(flag + " '" + v + "': must be " + allowed);
  return int(x);
}

struct Options {
  uint64_t minbytes = 8, maxbytes = 64ull << 20;
  int factor = 2, warmup = 5, iters = 20, poll_us = 50;
  bool check = true;
  mc::Progress progress = mc::Progress::None;
  std::string progress_name = "none";
  std::vector<Op> ops;
  std::vector<int> progress_cpus;
  mc::Staging staging = mc::Staging::Direct;
  std::string json, progress_cpus_text, staging_name = "direct";
};

// Parses argv (every rank does the same); throws UsageError with a one-line message.
// Returns false when --help was asked for (help text in *help).
bool parse_args(int argc, char** argv, Options& o, std::string* help) {
  std::string minb = "8", maxb = "64M", stepf = "2", warm = "5", iters = "20", ops = all_op_names(), check = "1",
              progress = "none", poll = "50";
  CLI::App app{
      "minicp-comm-bench: latency and bandwidth of the miniCP Communicator, nccl-tests style.\n"
      "For each op and size: time per iteration (max over ranks of the average), algbw = size/time,\n"
      "busbw = algbw * factor (allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall (n-1)/n;\n"
      "sendrecv, pingpong 1). Data type float32; sizes are rounded down to whole elements.",
      "minicp-comm-bench"};
  app.add_option("-b,--minbytes", minb, "Smallest size in bytes (suffix K, M, G)")
      ->capture_default_str()
      ->type_name("SIZE");
  app.add_option("-e,--maxbytes", maxb, "Largest size in bytes (suffix K, M, G; at most 2G)")
      ->capture_default_str()
      ->type_name("SIZE");
  app.add_option("-f,--stepfactor", stepf, "Multiply the size by this between steps (>= 2)")
      ->capture_default_str()
      ->type_name("INT");
  app.add_option("-w,--warmup_iters", warm, "Untimed iterations before each size (>= 0)")
      ->capture_default_str()
      ->type_name("INT");
  app.add_option("-n,--iters", iters, "Timed iterations per size (>= 1)")->capture_default_str()->type_name("INT");
  app.add_option("--ops", ops, "Comma-separated ops to run, from: " + all_op_names())
      ->capture_default_str()
      ->type_name("LIST");
  app.add_option("-c,--check", check, "1: check the data of one iteration per size before timing it; 0: don't")
      ->capture_default_str()
      ->type_name("0|1");
  app.add_option("--progress", progress,
                 "Progress of non-blocking ops: none (inside MPI calls only) or thread (a polling thread)")
      ->capture_default_str()
      ->type_name("MODE");
  app.add_option("--poll_us", poll, "Polling interval of the progress thread, microseconds (>= 1)")
      ->capture_default_str()
      ->type_name("INT");
  app.add_option("--progress_cpus", o.progress_cpus_text,
                 "Pin node-local rank i's progress thread to CPU LIST[i mod n] (needs --progress thread); "
                 "default: not pinned")
      ->type_name("LIST");
  app.add_option("--staging", o.staging_name,
                 "direct (MPI reads the buffers) or host (through host staging buffers; backend mpi-staged)")
      ->capture_default_str()
      ->type_name("MODE");
  app.add_option("--json", o.json, "Write all results to FILE (by rank 0, whole, then renamed into place; an old FILE is removed at start)")
      ->type_name("FILE");
  app.footer(
      "What `size` means (nccl-tests convention): the bytes of each rank's buffer.\n"
      "  pingpong        ranks 0 and 1 bounce `size` bytes; time = half the round trip (latency)\n"
      "  sendrecv        ring step: every rank sends `size` to rank+1 and receives from rank-1\n"
      "  alltoall        each rank's send (and receive) buffer is `size`: size/n to each peer\n"
      "  allgather       `size` is the gathered (receive) buffer: each rank contributes size/n\n"
      "  reduce_scatter  `size` is the send buffer: each rank receives size/n of the sum\n"
      "  allreduce       `size` is the buffer reduced (sum, in place)\n"
      "The count column is the count argument: elements per peer chunk for alltoall, allgather\n"
      "and reduce_scatter, elements of the whole buffer otherwise. p2p ops need 2 ranks.\n"
      "Each pingpong half trip is one isendrecv pair (size one way, 0 bytes back): the\n"
      "Communicator has no one-sided send. Exit status: 0 ok, 1 data check failed or run error,\n"
      "2 bad command line.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    *help = app.help();
    return false;
  } catch (const CLI::ParseError& e) {
    throw UsageError(std::string(e.what()) + " (see --help)");
  }
  o.minbytes = parse_size("-b/--minbytes", minb);
  o.maxbytes = parse_size("-e/--maxbytes", maxb);
  if (o.minbytes < 1) throw UsageError("-b/--minbytes '" + minb + "': must be at least 1 byte");
  if (o.minbytes > o.maxbytes)
    throw UsageError("-b/--minbytes '" + minb + "' is larger than -e/--maxbytes '" + maxb +
                     "': need minbytes <= maxbytes");
  o.factor = parse_int("-f/--stepfactor", stepf, 2, 1 << 20, "an integer >= 2");
  o.warmup = parse_int("-w/--warmup_iters", warm, 0, 1000000, "an integer >= 0");
  o.iters = parse_int("-n/--iters", iters, 1, 1000000, "an integer >= 1");
  o.check = parse_int("-c/--check", check, 0, 1, "0 or 1") == 1;
  o.poll_us = parse_int("--poll_us", poll, 1, 1000000, "an integer >= 1");
  try {
    o.progress = mc::parse_progress(progress);
    o.progress_name = progress;
  } catch (const std::invalid_argument&) {
    throw UsageError("--progress '" + progress + "': allowed values are none, thread");
  }
  try {
    o.staging = mc::parse_staging(o.staging_name);
  } catch (const std::invalid_argument&) {
    throw UsageError("--staging '" + o.staging_name + "': allowed values are direct, host");
  }
  try {
    o.progress_cpus = mc::parse_cpu_list(o.progress_cpus_text, "--progress_cpus");
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (!o.progress_cpus.empty() && o.progress != mc::Progress::Thread)
    throw UsageError("--progress_cpus '" + o.progress_cpus_text + "' needs --progress thread (got --progress " +
                     progress + ")");
  std::vector<bool> want(std::size(kOps), false);
  std::stringstream ss(ops);
  std::string item;
  bool any = false;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    size_t k = 0;
    while (k < std::size(kOps) && item != kOps[k].name) ++k;
    if (k == std::size(kOps))
      throw UsageError("--ops '" + ops + "': unknown op '" + item + "'; allowed: " + all_op_names());
    want[k] = any = true;
  }
  if (!any) throw UsageError("--ops '" + ops + "': no op named; allowed: " + all_op_names());
  for (size_t k = 0; k < std::size(kOps); ++k)
    if (want[k]) o.ops.push_back(kOps[k].op);
  if (o.json.empty() && app.count("--json")) throw UsageError("--json '': needs a file name");
  return true;
}

// Exact float32 test data: moved values below 2^24, reduced values small integers.
float pat(int rank, size_t i, int tag) {
  return float((uint64_t(rank + 1) * 1000003ull + uint64_t(i) * 7919ull + uint64_t(tag) * 104729ull) % 16777213ull);
}
float rv(int rank, size_t j) { return float(int((uint64_t(rank) * 3 + j) % 61) - 30); }

struct Row {
  Op op;
  uint64_t bytes, count;
  double time_us, algbw, busbw;
  int64_t wrong;  // -1: not checked
};

class Bench {
 public:
  Bench(mc::Communicator& c, const Options& o) : c_(c), o_(o), w_(c.world()), n_(w_.size), me_(w_.rank) {
    const size_t elems = std::max<size_t>(o.maxbytes / kElem, 1);
    a_.assign(elems, 0.0f);
    b_.assign(elems, 0.0f);
  }

  // count: elements per call argument (per-peer chunk for the chunked ops).
  Row measure(Op op, uint64_t size) {
    const bool chunked = info(op).chunked;
    const uint64_t count = chunked ? size / (kElem * n_) : size / kElem;
    const uint64_t bytes = chunked ? count * kElem * n_ : count * kElem;
    int64_t wrong = -1;
    if (o_.check) {
      wrong = check_once(op, count);
      c_.allreduce(&wrong, 1, mc::DType::I64, mc::ReduceOp::Sum, w_);
    }
    if (op == Op::AllReduce) std::fill(a_.begin(), a_.begin() + count, 0.0f);  // no growth over iterations
    c_.barrier(w_);
    for (int i = 0; i < o_.warmup; ++i) run_once(op, count);
    c_.barrier(w_);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < o_.iters; ++i) run_once(op, count);
    double t = (MPI_Wtime() - t0) / o_.iters;
    c_.allreduce(&t, 1, mc::DType::F64, mc::ReduceOp::Max, w_);
    if (op == Op::PingPong) t /= 2;  // half round trip
    c_.trace().clear();
    const double algbw = t > 0 ? double(bytes) / t / 1e9 : 0.0;
    return Row{op, bytes, count, t * 1e6, algbw, algbw * bus_factor(op, n_), wrong};
  }

  static const OpInfo& info(Op op) {
    for (const auto& o : kOps)
      if (o.op == op) return o;
    return kOps[0];
  }

 private:
  void wait(mc::Request r) { c_.wait(r); }

  void run_once(Op op, uint64_t count) {
    float* a = a_.data();
    float* b = b_.data();
    const size_t bytes = count * kElem;
    switch (op) {
      case Op::PingPong:
        if (me_ == 0) {
          wait(c_.isendrecv(a, bytes, 1, b, 0, 1, w_));
          wait(c_.isendrecv(a, 0, 1, b, bytes, 1, w_));
        } else if (me_ == 1) {
          wait(c_.isendrecv(a, 0, 0, b, bytes, 0, w_));
          wait(c_.isendrecv(a, bytes, 0, b, 0, 0, w_));
        }
        break;
      case Op::SendRecv:
        wait(c_.isendrecv(a, bytes, (me_ + 1) % n_, b, bytes, (me_ + n_ - 1) % n_, w_));
        break;
      case Op::AllToAll: c_.alltoall(a, b, bytes, w_); break;
      case Op::AllGather: wait(c_.iallgather(a, b, bytes, w_)); break;
      case Op::ReduceScatter: wait(c_.ireduce_scatter(a, b, count, mc::DType::F32, w_)); break;
      case Op::AllReduce: c_.allreduce(a, count, mc::DType::F32, mc::ReduceOp::Sum, w_); break;
    }
  }

  // Fills the buffers with rank-stamped data, runs the op once, returns this rank's number of
  // wrong elements.
  int64_t check_once(Op op, uint64_t count) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const size_t total = info(op).chunked ? count * n_ : count;
    std::fill(b_.begin(), b_.begin() + std::max<size_t>(total, 1), nan);
    float* a = a_.data();
    const float* b = b_.data();
    int64_t bad = 0;
    switch (op) {
      case Op::PingPong:
      case Op::SendRecv:
        for (size_t i = 0; i < count; ++i) a[i] = pat(me_, i, 0);
        break;
      case Op::AllToAll:
        for (int d = 0; d < n_; ++d)
          for (size_t k = 0; k < count; ++k) a[d * count + k] = pat(me_, k, d + 1);
        break;
      case Op::AllGather:
        for (size_t k = 0; k < count; ++k) a[k] = pat(me_, k, 0);
        break;
      case Op::ReduceScatter:
        for (size_t j = 0; j < count * n_; ++j) a[j] = rv(me_, j);
        break;
      case Op::AllReduce:
        for (size_t k = 0; k < count; ++k) a[k] = rv(me_, k);
        break;
    }
    run_once(op, count);
    switch (op) {
      case Op::PingPong:
        if (me_ < 2)
          for (size_t i = 0; i < count; ++i) bad += b[i] != pat(1 - me_, i, 0);
        break;
      case Op::SendRecv:
        for (size_t i = 0; i < count; ++i) bad += b[i] != pat((me_ + n_ - 1) % n_, i, 0);
        break;
      case Op::AllToAll:
        for (int s = 0; s < n_; ++s)
          for (size_t k = 0; k < count; ++k) bad += b[s * count + k] != pat(s, k, me_ + 1);
        break;
      case Op::AllGather:
        for (int s = 0; s < n_; ++s)
          for (size_t k = 0; k < count; ++k) bad += b[s * count + k] != pat(s, k, 0);
        break;
      case Op::ReduceScatter:
        for (size_t k = 0; k < count; ++k) {
          float sum = 0;
          for (int s = 0; s < n_; ++s) sum += rv(s, me_ * count + k);
          bad += b[k] != sum;
        }
        break;
      case Op::AllReduce:
        for (size_t k = 0; k < count; ++k) {
          float sum = 0;
          for (int s = 0; s < n_; ++s) sum += rv(s, k);
          bad += a[k] != sum;
        }
        break;
    }
    return bad;
  }

  mc::Communicator& c_;
  const Options& o_;
  const mc::Group& w_;
  int n_, me_;
  std::vector<float> a_, b_;
};

std::string json_escape(const std::string& s) {
  std::string r;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') {
      r += '\\';
      r += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      r += buf;
    } else {
      r += ch;
    }
  }
  return r;
}
std::string json_num(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

// Writes the JSON to path.tmp.<pid>, then renames it over path.
bool write_json(const std::string& path, const std::string& backend, const std::string& library, int ranks, int hosts,
                const Options& o, const std::vector<Row>& rows, const std::vector<std::string>& skipped) {
  std::ostringstream js;
  js << "{\n  \"backend\": \"" << json_escape(backend) << "\",\n  \"mpi_library\": \"" << json_escape(library)
     << "\",\n  \"ranks\": " << ranks << ",\n  \"hosts\": " << hosts << ",\n  \"progress\": \"" << o.progress_name
     << "\",\n  \"progress_cpus\": \"" << json_escape(o.progress_cpus_text) << "\",\n  \"dtype\": \"float32\",\n  \"warmup_iters\": " << o.warmup << ",\n  \"iters\": " << o.iters
     << ",\n  \"check\": " << (o.check ? 1 : 0) << ",\n  \"skipped\": [";
  for (size_t i = 0; i < skipped.size(); ++i) js << (i ? ", " : "") << '"' << skipped[i] << '"';
  js << "],\n  \"results\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    js << (i ? ",\n" : "\n") << "    {\"op\": \"" << Bench::info(r.op).name << "\", \"bytes\": " << r.bytes
       << ", \"count\": " << r.count << ", \"time_us\": " << json_num(r.time_us)
       << ", \"algbw_GBps\": " << json_num(r.algbw) << ", \"busbw_GBps\": " << json_num(r.busbw)
       << ", \"wrong\": " << (r.wrong < 0 ? std::string("null") : std::to_string(r.wrong)) << "}";
  }
  js << "\n  ]\n}\n";
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return false;
  const std::string s = js.str();
  bool ok = std::fwrite(s.data(), 1, s.size(), f) == s.size();
  ok = (std::fclose(f) == 0) && ok;
  if (ok) ok = std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) std::remove(tmp.c_str());
  return ok;
}

int run(const Options& o, int rank, int nranks) {
  auto comm = mc::make_mpi_comm(o.progress, o.poll_us, o.progress_cpus, o.staging);
  // Hosts: distinct processor names.
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> names(size_t(nranks) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                MPI_COMM_WORLD);
  std::map<std::string, int> per_host;
  for (int r = 0; r < nranks; ++r) ++per_host[std::string(&names[size_t(r) * MPI_MAX_PROCESSOR_NAME])];
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  MPI_Get_library_version(lib, &len);
  std::string library(lib);
  library = library.substr(0, library.find_first_of(",\n"));

  if (rank == 0 && !o.json.empty()) std::remove(o.json.c_str());  // no stale results if this run fails
  std::vector<uint64_t> sizes;
  for (uint64_t s = o.minbytes; s <= o.maxbytes; s *= uint64_t(o.factor)) {
    sizes.push_back(s);
    if (s > o.maxbytes / uint64_t(o.factor)) break;
  }
  const bool root = rank == 0;
  if (root) {
    std::printf("# minicp-comm-bench: miniCP Communicator latency and bandwidth (nccl-tests conventions)\n");
    std::printf("# backend: %s (%s)  ranks: %d  hosts: %zu  progress: %s", comm->backend().c_str(), library.c_str(),
                nranks, per_host.size(), o.progress_name.c_str());
    if (o.progress == mc::Progress::Thread) std::printf(" (poll %d us)", o.poll_us);
    if (!o.progress_cpus.empty()) std::printf(" (progress CPUs %s)", o.progress_cpus_text.c_str());
    std::printf("\n# sizes: %llu .. %llu B, step factor %d  warmup: %d  iters: %d  check: %d  dtype: float32\n",
                (unsigned long long)o.minbytes, (unsigned long long)o.maxbytes, o.factor, o.warmup, o.iters,
                o.check ? 1 : 0);
    for (const auto& [h, k] : per_host) std::printf("#   host %s: %d rank%s\n", h.c_str(), k, k == 1 ? "" : "s");
    std::fflush(stdout);
  }

  Bench bench(*comm, o);
  std::vector<Row> rows;
  std::vector<std::string> skipped;
  int64_t total_wrong = 0;
  for (Op op : o.ops) {
    const OpInfo& inf = Bench::info(op);
    if (inf.p2p && nranks < 2) {
      skipped.push_back(inf.name);
      if (root) std::printf("#\n# %s: skipped, needs at least 2 ranks\n", inf.name);
      continue;
    }
    if (root) {
      if (bus_factor(op, nranks) == 1.0 && std::strcmp(factor_text(op), "1") == 0)
        std::printf("#\n# %s  busbw = algbw\n", inf.name);
      else
        std::printf("#\n# %s  busbw = algbw * %s = algbw * %.4g\n", inf.name, factor_text(op), bus_factor(op, nranks));
      std::printf("# %12s  %12s  %10s  %11s  %11s  %6s\n", "size(B)", "count(elems)", "time(us)", "algbw(GB/s)",
                  "busbw(GB/s)", "#wrong");
      std::fflush(stdout);
    }
    for (uint64_t s : sizes) {
      const Row r = bench.measure(op, s);
      rows.push_back(r);
      if (r.wrong > 0) total_wrong += r.wrong;
      if (root) {
        std::printf("  %12llu  %12llu  %10.2f  %11.3f  %11.3f  %6s\n", (unsigned long long)r.bytes,
                    (unsigned long long)r.count, r.time_us, r.algbw, r.busbw,
                    r.wrong < 0 ? "N/A" : std::to_string(r.wrong).c_str());
        std::fflush(stdout);
      }
    }
  }

  if (root) {
    std::printf("#\n");
    for (Op op : o.ops) {
      const char* nm = Bench::info(op).name;
      if (std::find(skipped.begin(), skipped.end(), nm) != skipped.end()) {
        std::printf("MINICP_COMM op=%s ranks=%d skipped=needs_2_ranks\n", nm, nranks);
        continue;
      }
      const Row* best = nullptr;
      double sum = 0, min_t = std::numeric_limits<double>::infinity();
      int k = 0;
      int64_t wrong = 0;
      bool checked = false;
      for (const Row& r : rows) {
        if (r.op != op) continue;
        if (!best || r.busbw > best->busbw) best = &r;
        sum += r.busbw;
        min_t = std::min(min_t, r.time_us);
        ++k;
        if (r.wrong >= 0) {
          checked = true;
          wrong += r.wrong;
        }
      }
      if (!best) continue;
      std::printf("MINICP_COMM op=%s ranks=%d max_busbw_GBps=%.3f at_bytes=%llu avg_busbw_GBps=%.3f min_time_us=%.2f",
                  nm, nranks, best->busbw, (unsigned long long)best->bytes, sum / k, min_t);
      if (checked)
        std::printf(" wrong=%lld\n", (long long)wrong);
      else
        std::printf(" wrong=N/A\n");
    }
    if (total_wrong > 0) std::printf("# FAILED: %lld wrong elements\n", (long long)total_wrong);
    std::fflush(stdout);
  }

  int status = total_wrong > 0 ? 1 : 0;
  if (root && !o.json.empty()) {
    if (!write_json(o.json, comm->backend(), library, nranks, int(per_host.size()), o, rows, skipped)) {
      std::fprintf(stderr, "minicp-comm-bench: cannot write --json '%s': %s\n", o.json.c_str(), std::strerror(errno));
      status = 1;
    }
  }
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  Options o;
  std::string help;
  try {
    if (!parse_args(argc, argv, o, &help)) {
      if (rank == 0) std::fputs(help.c_str(), stdout);
      MPI_Finalize();
      return 0;
    }
  } catch (const UsageError& e) {
    if (rank == 0) std::fprintf(stderr, "minicp-comm-bench: error: %s\n", e.what());
    MPI_Finalize();
    return 2;
  }
  int status = 0;
  try {
    status = run(o, rank, nranks);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "minicp-comm-bench: rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return status;
}
