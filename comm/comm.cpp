// Backend-neutral parts of the communicator: group splits along the rank grid, the events
// and byte count of every call, the node topology, sizes of the data types, parsing of the
// progress strategy.
#include "comm/comm.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <unistd.h>

namespace minicp::comm {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::I64: return 8;
    case DType::BF16: return 2;
  }
  return 0;
}

Progress parse_progress(const std::string& s) {
  if (s == "none") return Progress::None;
  if (s == "thread") return Progress::Thread;
  throw std::invalid_argument("progress '" + s + "' is not one of: none, thread");
}

Staging parse_staging(const std::string& s) {
  if (s == "direct") return Staging::Direct;
  if (s == "host") return Staging::Host;
  throw std::invalid_argument("staging '" + s + "' is not one of: direct, host");
}

std::vector<int> parse_cpu_list(const std::string& s, const std::string& flag) {
  std::vector<int> out;
  const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  size_t pos = 0;
  while (!s.empty() && pos <= s.size()) {
    const size_t end = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, end - pos);
    size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < 0 || v >= ncpu)
      throw std::invalid_argument(flag + " '" + s + "': allowed is a comma list of CPU numbers 0.." +
                                  std::to_string(ncpu - 1) + " (the CPUs online on this node), e.g. 0,1");
    out.push_back(v);
    pos = end + 1;
  }
  return out;
}

namespace {
void check_divides(int size, int ranks, const std::string& name) {
  if (size < 1 || ranks % size != 0)
    throw std::invalid_argument("group '" + name + "' size " + std::to_string(size) + " must divide the " +
                                std::to_string(ranks) + " ranks");
}
}  // namespace

Group Communicator::split_contiguous(int size, const std::string& name) {
  check_divides(size, world_.size, name);
  return split_color(world_.rank / size, name);
}

Group Communicator::split_strided(int size, const std::string& name) {
  check_divides(size, world_.size, name);
  return split_color(world_.rank % (world_.size / size), name);
}

Group Communicator::split_job(int color, const std::string& name) {
  if (color < 0) throw std::invalid_argument("group '" + name + "': a job split's color must be >= 0");
  return split_job_color(color, name);
}

void Communicator::narrow_world(int color, const std::string& name) {
  world_ = split_job(color, name);
  topology_ = node_topology(world_.mpi);
}

Event Communicator::posted(EventKind kind, int peer, const Group& g, int step, int64_t payload_bytes) {
  if (kind == EventKind::SendRecv && peer == g.rank) payload_bytes = 0;  // stays on this rank
  const int64_t bytes = bytes_leaving(kind, payload_bytes, g.size);
  bytes_sent_ += bytes;
  Event e{kind, peer, g.id, step, bytes, 0, MPI_Wtime(), 0};
  trace_.stamp(e);
  return e;
}

int64_t Communicator::to_others(const std::vector<size_t>& send_bytes, const Group& g) {
  int64_t sum = 0;
  for (size_t i = 0; i < send_bytes.size(); ++i)
    if (int(i) != g.rank) sum += int64_t(send_bytes[i]);
  return sum;
}

Event Communicator::wait_event(const Event& op, double t0, double t1) {
  Event w = op;  // the posting context of the operation waited for
  w.kind = EventKind::Wait, w.bytes = bytes_leaving(EventKind::Wait, 0, 1), w.flops = 0;
  w.t_begin = t0, w.t_end = t1;
  return w;
}

Topology Communicator::node_topology(const void* mpi_comm) {
  const MPI_Comm base = mpi_comm ? *static_cast<const MPI_Comm*>(mpi_comm) : MPI_COMM_WORLD;
  int me = 0, P = 1;
  MPI_Comm_rank(base, &me);
  MPI_Comm_size(base, &P);
  Topology t;
  // The code base's one split by shared memory; key = world rank orders the local ranks.
  MPI_Comm node;
  if (MPI_Comm_split_type(base, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &node) != MPI_SUCCESS)
    throw std::runtime_error("MPI Comm_split_type failed");
  MPI_Comm_rank(node, &t.local_rank);
  MPI_Comm_size(node, &t.local_size);
  int lowest = me;  // a node is known by its lowest world rank
  MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  std::vector<int> lowest_of(size_t(P), 0);
  MPI_Allgather(&lowest, 1, MPI_INT, lowest_of.data(), 1, MPI_INT, base);
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> names(size_t(P) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, base);
  // Walking the world ranks in order meets each node first at its lowest rank: that is the
  // node order, and that rank's host name is the node's.
  std::vector<int> index(size_t(P), -1), count;
  t.nodes = 0;
  t.node_of_rank.resize(size_t(P));
  for (int r = 0; r < P; ++r) {
    const int lo = lowest_of[size_t(r)];
    if (index[size_t(lo)] < 0) {
      index[size_t(lo)] = t.nodes++;
      const char* h = names.data() + size_t(lo) * MPI_MAX_PROCESSOR_NAME;
      t.hosts.emplace_back(h, strnlen(h, MPI_MAX_PROCESSOR_NAME));
      count.push_back(0);
    }
    t.node_of_rank[size_t(r)] = index[size_t(lo)];
    ++count[size_t(index[size_t(lo)])];
  }
  t.node = t.node_of_rank[size_t(me)];
  t.min_local_size = *std::min_element(count.begin(), count.end());
  return t;
}

#ifndef MINICP_ENABLE_NCCL
std::string nccl_unavailable(int) {
  return "this build has no NCCL backend (configure with -DMINICP_ENABLE_NCCL=ON, or -DMINICP_ENABLE_CUDA=ON)";
}
std::unique_ptr<Communicator> make_nccl_comm(int, void*) {
  throw std::runtime_error("nccl backend: " + nccl_unavailable(1));
}
#endif

}  // namespace minicp::comm
