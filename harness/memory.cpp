// Available memory (meminfo, cgroup v2), node-local rank count and the memory refusal.
#include "harness/memory.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

namespace minicp::harness {

namespace {
// First integer of a one-line file ("max" and unreadable files give -1).
int64_t read_number(const std::string& file) {
  std::ifstream f(file);
  std::string s;
  if (!(f >> s) || s == "max") return -1;
  try {
    return std::stoll(s);
  } catch (const std::exception&) {
    return -1;
  }
}

int64_t meminfo_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (f >> key >> kib) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

// The smallest (memory.max - memory.current) over this process's cgroup v2 and its
// ancestors; -1 when none sets a limit.
int64_t cgroup_room() {
  std::ifstream f("/proc/self/cgroup");
  std::string line, path = "/";
  while (std::getline(f, line))
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  int64_t room = -1;
  while (true) {
    const std::string dir = "/sys/fs/cgroup" + (path == "/" ? std::string() : path);
    const int64_t max = read_number(dir + "/memory.max"), cur = read_number(dir + "/memory.current");
    if (max >= 0) {
      const int64_t r = std::max<int64_t>(0, max - std::max<int64_t>(cur, 0));
      room = room < 0 ? r : std::min(room, r);
    }
    if (path == "/" || path.empty()) break;
    const size_t slash = path.find_last_of('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
  return room;
}
}  // namespace

int64_t node_available_bytes() {
  const int64_t mem = meminfo_available(), cg = cgroup_room();
  if (mem < 0) return cg;
  if (cg < 0) return mem;
  return std::min(mem, cg);
}

std::string human_bytes(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 8) bytes /= 1024.0, ++u;
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", bytes, units[u]);
  return buf;
}

std::string memory_message(const std::string& what, double predicted, double available, int local_ranks, bool per_rank,
                           const std::string& node) {
  if (!per_rank)
    return what + ": needs " + human_bytes(predicted) + " (predicted), " + human_bytes(available) + " available";
  return what + ": needs " + human_bytes(predicted) + " per rank (predicted), " + human_bytes(available) +
         " available per rank (" + std::to_string(local_ranks) + " rank" + (local_ranks == 1 ? "" : "s") + " on " +
         node + ")";
}

void check_memory(const Args& a, const std::string& what, double predicted_per_rank, int local_ranks) {
  const int64_t node = node_available_bytes();
  local_ranks = std::max(local_ranks, 1);
  double mine = node < 0 ? std::numeric_limits<double>::infinity() : double(node) / local_ranks;
  if (!a.mpi()) {
    if (predicted_per_rank > mine) throw UsageError(memory_message(what, predicted_per_rank, mine, 1, false));
    return;
  }
  // The rank with the least memory per rank decides; every rank learns its numbers.
  struct {
    double value;
    int rank;
  } in{mine, a.rank()}, low{};
  MPI_Allreduce(&in, &low, 1, MPI_DOUBLE_INT, MPI_MINLOC, MPI_COMM_WORLD);
  int ranks_there = local_ranks;
  MPI_Bcast(&ranks_there, 1, MPI_INT, low.rank, MPI_COMM_WORLD);
  if (predicted_per_rank <= low.value) return;
  // Ranks that share a node read its free memory a moment apart, so the lowest can be any of
  // them: the node is named by host, "this node" being rank 0's.
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  const std::string mine_host(host, size_t(len));
  const bool here = bcast_string(mine_host, MPI_COMM_WORLD, low.rank) == bcast_string(mine_host, MPI_COMM_WORLD, 0);
  throw UsageError(memory_message(what, predicted_per_rank, low.value, ranks_there, true,
                                  here ? "this node" : "the node of rank " + std::to_string(low.rank)));
}

}  // namespace minicp::harness
