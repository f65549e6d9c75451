// minicp-comm-bench: p2p latency/bandwidth and collective busbw of the miniCP Communicator
// (so the backend is what is measured), in the manner of nccl-tests and OSU: a size sweep
// per op, a table per op, one MINICP_COMM summary line per op, optional JSON. The command
// line, the --json path and the buffers' memory are checked before the sweep (harness/).
#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "harness/cli.hpp"
#include "harness/fabric.hpp"
#include "harness/main.hpp"
#include "harness/memory.hpp"
#include "harness/output.hpp"

namespace {
namespace mc = minicp::comm;
namespace hn = minicp::harness;
using hn::UsageError;

// The file_kind of the JSON this program writes: an existing --json without it is another
// program's file, replaced only with --overwrite.
const char* const kFileKind = "minicp-comm-bench";

enum class Op { PingPong, SendRecv, AllToAll, AllGather, ReduceScatter, AllReduce };
struct OpInfo {
  Op op;
  const char* name;
  bool p2p;
  bool chunked;  // size = whole buffer, split into one chunk per rank (nccl-tests convention)
};
constexpr OpInfo kOps[] = {
    {Op::PingPong, "pingpong", true, false},
    {Op::SendRecv, "sendrecv", true, false},
    {Op::AllToAll, "alltoall", false, true},
    {Op::AllGather, "allgather", false, true},
    {Op::ReduceScatter, "reduce_scatter", false, true},
    {Op::AllReduce, "allreduce", false, false},
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
  bool overwrite = false;  // --overwrite: an existing --json of another kind may be replaced
  std::string fabric;      // --fabric (applied before MPI_Init by main)
  hn::MpiSelection mpi;    // what MPI selected, checked against the profile
};

// What the command line gives as text, checked after parsing.
struct RawFlags {
  std::string minb = "8", maxb = "64M", ops = all_op_names(), progress = "none";
  int check = 1;
};

void declare_flags(CLI::App& app, Options& o, RawFlags& raw) {
  app.add_option("-b,--minbytes", raw.minb, "Smallest size in bytes (suffix K, M, G)")
      ->capture_default_str()
      ->type_name("SIZE");
  app.add_option("-e,--maxbytes", raw.maxb, "Largest size in bytes (suffix K, M, G; at most 2G)")
      ->capture_default_str()
      ->type_name("SIZE");
  hn::add_int(app, "-f,--stepfactor", o.factor, 2, 1 << 20, "Multiply the size by this between steps");
  hn::add_int(app, "-w,--warmup-iters", o.warmup, 0, 1000000, "Untimed iterations before each size");
  hn::add_int(app, "-n,--iters", o.iters, 1, 1000000, "Timed iterations per size");
  app.add_option("--ops", raw.ops, "Comma-separated ops to run, from: " + all_op_names())
      ->capture_default_str()
      ->type_name("LIST");
  hn::add_int(app, "-c,--check", raw.check, 0, 1,
              "1: check the data of one iteration per size before timing it; 0: don't")
      ->type_name("0|1");
  app.add_option("--progress", raw.progress,
                 "Progress of non-blocking ops: none (inside MPI calls only) or thread (a polling thread)")
      ->capture_default_str()
      ->type_name("MODE");
  hn::add_int(app, "--poll-us", o.poll_us, 1, 1000000, "Polling interval of the progress thread, microseconds");
  app.add_option("--progress-cpus", o.progress_cpus_text,
                 "Pin node-local rank i's progress thread to CPU LIST[i mod n] (needs --progress thread); "
                 "default: not pinned")
      ->type_name("LIST");
  app.add_option("--staging", o.staging_name,
                 "direct (MPI reads the buffers) or host (through host staging buffers; backend mpi-staged)")
      ->capture_default_str()
      ->type_name("MODE");
  app.add_option("--fabric", o.fabric,
                 "Fabric profile: a name from inputs/fabrics/ or a profile file; applied before MPI starts and what "
                 "MPI selects is checked; default: none (MPI's own choice)")
      ->type_name("NAME");
  app.add_option("--json", o.json,
                 "Write all results to FILE (by rank 0, whole, then renamed into place; checked before the run, "
                 "and an old FILE is removed when the run starts)")
      ->type_name("FILE");
  app.add_flag("--overwrite", o.overwrite,
               "Replace an existing --json that is not a minicp-comm-bench result; default: off");
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
}

// --ops LIST: each op once, in the table's order.
std::vector<Op> parse_ops(const std::string& list) {
  std::vector<Op> out;
  std::vector<bool> want(std::size(kOps), false);
  std::stringstream ss(list);
  std::string item;
  bool any = false;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    size_t k = 0;
    while (k < std::size(kOps) && item != kOps[k].name) ++k;
    if (k == std::size(kOps))
      throw UsageError("--ops '" + list + "': unknown op '" + item + "'; allowed: " + all_op_names());
    if (want[k]) throw UsageError("--ops '" + list + "': op '" + item + "' is listed twice; name each op once");
    want[k] = any = true;
  }
  if (!any) throw UsageError("--ops '" + list + "': no op named; allowed: " + all_op_names());
  for (size_t k = 0; k < std::size(kOps); ++k)
    if (want[k]) out.push_back(kOps[k].op);
  return out;
}

// The sizes, the progress and staging settings and their CPUs, from the flags' text.
void check_flags(Options& o, const RawFlags& raw) {
  o.check = raw.check == 1;
  o.minbytes = parse_size("-b/--minbytes", raw.minb);
  o.maxbytes = parse_size("-e/--maxbytes", raw.maxb);
  if (o.minbytes < 1) throw UsageError("-b/--minbytes '" + raw.minb + "': must be at least 1 byte");
  if (o.minbytes > o.maxbytes)
    throw UsageError("-b/--minbytes '" + raw.minb + "' is larger than -e/--maxbytes '" + raw.maxb +
                     "': need minbytes <= maxbytes");
  try {
    o.progress = mc::parse_progress(raw.progress);
    o.progress_name = raw.progress;
  } catch (const std::invalid_argument&) {
    throw UsageError("--progress '" + raw.progress + "': allowed values are none, thread");
  }
  try {
    o.staging = mc::parse_staging(o.staging_name);
  } catch (const std::invalid_argument&) {
    throw UsageError("--staging '" + o.staging_name + "': allowed values are direct, host");
  }
  try {
    o.progress_cpus = mc::parse_cpu_list(o.progress_cpus_text, "--progress-cpus");
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (!o.progress_cpus.empty() && o.progress != mc::Progress::Thread)
    throw UsageError("--progress-cpus '" + o.progress_cpus_text + "' needs --progress thread (got --progress " +
                     raw.progress + ")");
}

// Parses the command line (every rank does the same) and checks it, the --json path and
// the memory of the two buffers; throws UsageError with a one-line message.
void parse_args(const hn::Args& a, Options& o) {
  RawFlags raw;
  CLI::App app{
      "minicp-comm-bench: latency and bandwidth of the miniCP Communicator, nccl-tests style.\n"
      "For each op and size: time per iteration (max over ranks of the average), algbw = size/time,\n"
      "busbw = algbw * factor (allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall (n-1)/n;\n"
      "sendrecv, pingpong 1). Data type float32; sizes are rounded down to whole elements.",
      a.prog()};
  declare_flags(app, o, raw);
  hn::parse(app, a);
  o.mpi = hn::verify_fabric(MPI_COMM_WORLD);
  check_flags(o, raw);
  o.ops = parse_ops(raw.ops);
  if (app.count("--json"))
    hn::check_outputs(a, {{"--json", o.json, "a minicp-comm-bench result", hn::json_file_kind(kFileKind)}},
                      o.overwrite);
  // The two buffers of -e/--maxbytes each (host staging adds pooled copies of what is in flight).
  hn::check_memory(a, "-e/--maxbytes " + raw.maxb, 2.0 * double(o.maxbytes),
                   mc::Communicator::node_topology().local_size);
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
      case Op::SendRecv: wait(c_.isendrecv(a, bytes, (me_ + 1) % n_, b, bytes, (me_ + n_ - 1) % n_, w_)); break;
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

// The --json document; keys as documented in comm/bench/README.md.
hn::Json results_json(const std::string& backend, const std::string& library, int ranks, int hosts, const Options& o,
                      const std::vector<Row>& rows, const std::vector<std::string>& skipped) {
  hn::Json js;
  js["file_kind"] = kFileKind;
  js["backend"] = backend;
  js["mpi_library"] = library;
  js["ranks"] = ranks;
  js["hosts"] = hosts;
  js["progress"] = o.progress_name;
  const hn::FabricProfile* fab = hn::applied_fabric();
  js["fabric"] = fab ? fab->name : "";
  js["fabric_settings"] = fab ? fab->settings() : "";
  js["mpi_pml"] = o.mpi.pml;
  js["mpi_btls"] = o.mpi.btl_list();
  js["progress_cpus"] = o.progress_cpus_text;
  js["dtype"] = "float32";
  js["warmup_iters"] = o.warmup;
  js["iters"] = o.iters;
  js["check"] = o.check ? 1 : 0;
  js["skipped"] = skipped;
  js["results"] = hn::Json::array();
  for (const Row& r : rows) {
    hn::Json x;
    x["op"] = Bench::info(r.op).name;
    x["bytes"] = r.bytes;
    x["count"] = r.count;
    x["time_us"] = r.time_us;
    x["algbw_GBps"] = r.algbw;
    x["busbw_GBps"] = r.busbw;
    x["wrong"] = r.wrong < 0 ? hn::Json() : hn::Json(r.wrong);
    js["results"].push_back(x);
  }
  return js;
}

// The job as the header prints it: MPI's library, and the ranks of each host (distinct
// processor names).
struct Job {
  std::string library;
  std::map<std::string, int> per_host;
};

Job job_of(int nranks) {
  Job j;
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> names(size_t(nranks) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
  for (int r = 0; r < nranks; ++r) ++j.per_host[std::string(&names[size_t(r) * MPI_MAX_PROCESSOR_NAME])];
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  MPI_Get_library_version(lib, &len);
  j.library = std::string(lib);
  j.library = j.library.substr(0, j.library.find_first_of(",\n"));
  return j;
}

// minbytes, minbytes * factor, ... up to maxbytes.
std::vector<uint64_t> size_list(const Options& o) {
  std::vector<uint64_t> sizes;
  for (uint64_t s = o.minbytes; s <= o.maxbytes; s *= uint64_t(o.factor)) {
    sizes.push_back(s);
    if (s > o.maxbytes / uint64_t(o.factor)) break;
  }
  return sizes;
}

void print_header(const mc::Communicator& comm, const Job& job, int nranks, const Options& o) {
  std::printf("# minicp-comm-bench: miniCP Communicator latency and bandwidth (nccl-tests conventions)\n");
  std::printf("# backend: %s (%s)  ranks: %d  hosts: %zu  progress: %s", comm.backend().c_str(), job.library.c_str(),
              nranks, job.per_host.size(), o.progress_name.c_str());
  if (o.progress == mc::Progress::Thread) std::printf(" (poll %d us)", o.poll_us);
  if (!o.progress_cpus.empty()) std::printf(" (progress CPUs %s)", o.progress_cpus_text.c_str());
  if (const hn::FabricProfile* f = hn::applied_fabric()) std::printf("  fabric: %s", f->name.c_str());
  if (!o.mpi.pml.empty()) std::printf("  pml: %s", o.mpi.pml.c_str());
  if (o.mpi.pml == "ob1") std::printf("  btls: %s", o.mpi.btl_list().c_str());
  std::printf("\n# sizes: %llu .. %llu B, step factor %d  warmup: %d  iters: %d  check: %d  dtype: float32\n",
              (unsigned long long)o.minbytes, (unsigned long long)o.maxbytes, o.factor, o.warmup, o.iters,
              o.check ? 1 : 0);
  for (const auto& [h, k] : job.per_host) std::printf("#   host %s: %d rank%s\n", h.c_str(), k, k == 1 ? "" : "s");
  std::fflush(stdout);
}

// What the ops measured: a row per (op, size), the ops skipped, the wrong elements in all.
struct Measured {
  std::vector<Row> rows;
  std::vector<std::string> skipped;
  int64_t total_wrong = 0;
};

// Every op at every size, each op's table printed by rank 0 as it goes.
Measured measure_ops(Bench& bench, const Options& o, const std::vector<uint64_t>& sizes, int nranks, bool root) {
  Measured m;
  for (Op op : o.ops) {
    const OpInfo& inf = Bench::info(op);
    if (inf.p2p && nranks < 2) {
      m.skipped.push_back(inf.name);
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
      m.rows.push_back(r);
      if (r.wrong > 0) m.total_wrong += r.wrong;
      if (root) {
        std::printf("  %12llu  %12llu  %10.2f  %11.3f  %11.3f  %6s\n", (unsigned long long)r.bytes,
                    (unsigned long long)r.count, r.time_us, r.algbw, r.busbw,
                    r.wrong < 0 ? "N/A" : std::to_string(r.wrong).c_str());
        std::fflush(stdout);
      }
    }
  }
  return m;
}

// One grep-able MINICP_COMM line per op: its best and average busbw, its smallest time.
void print_summary(const Measured& m, const Options& o, int nranks) {
  std::printf("#\n");
  for (Op op : o.ops) {
    const char* nm = Bench::info(op).name;
    if (std::find(m.skipped.begin(), m.skipped.end(), nm) != m.skipped.end()) {
      std::printf("MINICP_COMM op=%s ranks=%d skipped=needs_2_ranks\n", nm, nranks);
      continue;
    }
    const Row* best = nullptr;
    double sum = 0, min_t = std::numeric_limits<double>::infinity();
    int k = 0;
    int64_t wrong = 0;
    bool checked = false;
    for (const Row& r : m.rows) {
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
    std::printf("MINICP_COMM op=%s ranks=%d max_busbw_GBps=%.3f at_bytes=%llu avg_busbw_GBps=%.3f min_time_us=%.2f", nm,
                nranks, best->busbw, (unsigned long long)best->bytes, sum / k, min_t);
    if (checked)
      std::printf(" wrong=%lld\n", (long long)wrong);
    else
      std::printf(" wrong=N/A\n");
  }
  if (m.total_wrong > 0) std::printf("# FAILED: %lld wrong elements\n", (long long)m.total_wrong);
  std::fflush(stdout);
}

int run(const hn::Args& a, const Options& o) {
  const int nranks = a.size();
  const bool root = a.rank() == 0;
  hn::remove_old_outputs(a, {{"--json", o.json}});  // no stale results if this run fails
  auto comm = mc::make_mpi_comm(o.progress, o.poll_us, o.progress_cpus, o.staging);
  const Job job = job_of(nranks);
  if (root) print_header(*comm, job, nranks, o);
  Bench bench(*comm, o);
  const Measured m = measure_ops(bench, o, size_list(o), nranks, root);
  if (root) print_summary(m, o, nranks);
  if (root && !o.json.empty())
    hn::write_json("--json", o.json,
                   results_json(comm->backend(), job.library, nranks, int(job.per_host.size()), o, m.rows, m.skipped));
  return m.total_wrong > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The fabric profile's settings go into the environment before MPI starts.
  if (const int rc = hn::apply_fabric("minicp-comm-bench", {hn::flag_value(argc, argv, "--fabric"), "--fabric"});
      rc >= 0)
    return rc;
  Options o;
  return hn::main(
      argc, argv, "minicp-comm-bench", [&](const hn::Args& a) { parse_args(a, o); },
      [&](const hn::Args& a) { return run(a, o); });
}
