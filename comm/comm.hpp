// The communicator every CP scheme talks through: groups built from a rank grid,
// non-blocking send/recv pairs, (non-blocking) all-gather and reduce-scatter, all-to-all(v),
// all-reduce, barrier. Every call is recorded in the per-rank Trace and its bytes (see
// bytes_leaving in trace.hpp) are added to a running total. The node topology is computed
// once, at construction. Backends: MPI (host or GPU-aware buffers) and, under
// MINICP_ENABLE_CUDA, NCCL (comm/nccl_comm.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "comm/trace.hpp"

namespace minicp::comm {

// BF16: bfloat16 bits (the top half of an fp32); reductions add in fp32 and round once per
// element and hop, as a bf16 all-reduce on the wire does.
enum class DType { F32, F64, I64, BF16 };
enum class ReduceOp { Sum, Max };
size_t dtype_size(DType t);

// How outstanding non-blocking operations make progress while the caller computes.
//   none   - only inside MPI calls (Open MPI's shared-memory transport then moves large
//            messages only when wait() is reached: no overlap).
//   thread - a progress thread calls MPI_Testall on outstanding requests every poll_us.
enum class Progress { None, Thread };

// A set of ranks that communicate together (a sub-communicator). Ranks are group ranks.
struct Group {
  int id = 0;        // small integer recorded in trace events
  std::string name;  // "world", "ring", "ulysses", "node", "cross"
  int rank = 0, size = 1;
  std::vector<int> world_ranks;  // world rank of each group rank
  void* native = nullptr;        // backend handle (MPI_Comm*, ncclComm_t*)
  // An MPI_Comm* over the same ranks in the same order, whatever the backend: what a driver's
  // own control messages go over (barriers, rank 0's values for all, gathers of timings), which
  // no backend counts or traces and which take host memory.
  void* mpi = nullptr;
};

// Where the ranks of the world sit: nodes are the sets of ranks that share memory (one
// host). Computed once per communicator (collective over the world at construction), so
// the backends (progress-thread CPUs, GPU selection) and the schemes (ring sizes) agree.
struct Topology {
  int local_rank = 0, local_size = 1;  // this rank among its node's ranks (in world-rank order)
  int node = 0;                        // this rank's node, 0..nodes-1; nodes ordered by their lowest world rank
  int nodes = 1;
  int min_local_size = 1;          // fewest ranks on any node
  std::vector<std::string> hosts;  // one host name per node (MPI_Get_processor_name), index = node
  std::vector<int> node_of_rank;   // node index of every world rank
};

// Handle of a non-blocking operation; complete it with Communicator::wait. The state is
// the backend's own (MPI requests, CUDA events).
struct RequestState {
  virtual ~RequestState() = default;
};
struct Request {
  std::shared_ptr<RequestState> state;
  bool active() const { return state != nullptr; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string backend() const = 0;
  const Group& world() const { return world_; }

  // Splits the world into groups of `size` consecutive-rank members (color = rank / size)
  // or strided members (color = rank % (P/size)) - the two axes of a 2D rank grid.
  // Collective; throws std::invalid_argument when size does not divide the ranks.
  Group split_contiguous(int size, const std::string& name);
  Group split_strided(int size, const std::string& name);
  // The job: this communicator's ranks when it was made (its first world). narrow_world makes
  // the ranks of this rank's color (>= 0) the world, e.g. a mesh's CP group, which strides over
  // TP's (comm::Mesh::color), so the schemes run on it unchanged; the topology follows it.
  // split_job splits the job into the groups of the ranks that pass the same color (>= 0):
  // the groups of a mesh that reach outside that world, TP and CP x DP, whose operations go
  // through this communicator, counted and traced as every other group's. Both are collective
  // over the job's ranks (not MPI_COMM_WORLD's: the ranks a case leaves idle take no part).
  const Group& job() const { return job_; }
  void narrow_world(int color, const std::string& name = "world");
  Group split_job(int color, const std::string& name);

  // Sends `bytes` from send to group rank dst and receives `bytes` into recv from group
  // rank src, non-blocking (the ring step). Deadlock-free in any ring. channel (0..kChannels-1)
  // keeps exchanges that are in flight between the same ranks apart: a message is received
  // only by the exchange of its own channel, whatever order the two sides post them in.
  static constexpr int kChannels = 1000;
  virtual Request isendrecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes, int src,
                            const Group& g, int step = -1, int channel = 0) = 0;
  // Gathers `bytes` from every group rank into recv (rank i at offset i*bytes).
  virtual Request iallgather(const void* send, void* recv, size_t bytes, const Group& g, int step = -1) = 0;
  // recv[count] = sum over ranks of send[rank*count .. (rank+1)*count) for this rank.
  virtual Request ireduce_scatter(const void* send, void* recv, size_t count, DType t, const Group& g,
                                  int step = -1) = 0;
  virtual void alltoall(const void* send, void* recv, size_t bytes_per_rank, const Group& g, int step = -1) = 0;
  // Counts and displacements in bytes, one entry per group rank.
  virtual void alltoallv(const void* send, const std::vector<size_t>& send_bytes, const std::vector<size_t>& send_displ,
                         void* recv, const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_displ,
                         const Group& g, int step = -1) = 0;
  virtual void allreduce(void* buf, size_t count, DType t, ReduceOp op, const Group& g, int step = -1) = 0;
  // Non-blocking all-reduce in place (e.g. weight gradients, in flight during the backward
  // of the layers below); buf must stay untouched until wait().
  virtual Request iallreduce(void* buf, size_t count, DType t, ReduceOp op, const Group& g, int step = -1) = 0;
  virtual void barrier(const Group& g) = 0;
  // Blocks until the operation is complete; records a Wait event and the op's own event.
  virtual void wait(Request& r) = 0;

  Trace& trace() { return trace_; }
  // Bytes that left this rank since construction: the sum of bytes_leaving (trace.hpp) over
  // every call, counted when the call is posted, whether or not the trace is enabled.
  int64_t bytes_sent() const { return bytes_sent_; }
  const Topology& topology() const { return topology_; }
  // The node topology of the ranks of *(const MPI_Comm*)mpi_comm, or of MPI_COMM_WORLD when
  // null (collective over them); what topology() holds.
  static Topology node_topology(const void* mpi_comm = nullptr);
  Progress progress() const { return progress_; }
  // Seconds the progress thread has spent inside MPI calls (where it copies messages),
  // since construction; 0 without a progress thread.
  virtual double progress_busy_s() const { return 0; }
  // Seconds the collective thread has spent running all-reduces (progress = thread: the
  // all-reduces' own cost, whatever overlaps them); NaN where no such thread runs them.
  virtual double collective_busy_s() const { return std::numeric_limits<double>::quiet_NaN(); }

 protected:
  // The backend's split: ranks with the same color form a group, ordered by world rank.
  virtual Group split_color(int color, const std::string& name) = 0;
  // The same over the job's ranks, ordered by job rank.
  virtual Group split_job_color(int color, const std::string& name) = 0;

  // The event of a call posted now (t_begin = MPI_Wtime()), its bytes by bytes_leaving;
  // adds them to bytes_sent(). Every operation builds its event here, once, when it is
  // posted: the one place the bytes are counted, so the trace and the total agree. A
  // send-receive to this rank itself counts 0.
  Event posted(EventKind kind, int peer, const Group& g, int step, int64_t payload_bytes);
  // The payload of an all-to-all-v: the sum of the send sizes to the other ranks of g.
  static int64_t to_others(const std::vector<size_t>& send_bytes, const Group& g);
  // The Wait event of a wait() on the operation op, blocked from t0 to t1.
  static Event wait_event(const Event& op, double t0, double t1);
  // The topology of MPI_COMM_WORLD (collective over it); each backend's constructor sets
  // topology_ from it.

  Group world_;
  Group job_;  // the world at construction (each backend's constructor sets both)
  Trace trace_;
  Topology topology_;
  Progress progress_ = Progress::None;
  int64_t bytes_sent_ = 0;
};

// Where the MPI backend's buffers are handed to MPI:
//   direct - MPI reads and writes the caller's buffers (host memory, or device memory with
//            a GPU-aware MPI);
//   host   - each buffer is copied to a host staging buffer before MPI sees it and results
//            are copied back in wait() (blocking ops: before they return): device buffers
//            with an MPI that is not GPU-aware. Copies use cudaMemcpy in CUDA/NCCL builds,
//            memcpy otherwise. Backend name "mpi-staged".
enum class Staging { Direct, Host };

// MPI backend (MPI must be initialised with MPI_THREAD_MULTIPLE when progress = Thread).
// Its world is MPI_COMM_WORLD, or with group_size > 0 the group of group_size consecutive
// world ranks this rank belongs to (world rank / group_size; collective over MPI_COMM_WORLD):
// e.g. a CP group smaller than the job, or each rank alone (1) for a single-rank reference.
// poll_us: progress-thread polling interval in microseconds.
// progress_cpus: CPUs the progress thread is pinned to, one per node-local rank (local
// rank i takes entry i mod size); empty leaves it where the OS puts it. A CPU that does
// not exist throws std::invalid_argument.
std::unique_ptr<Communicator> make_mpi_comm(Progress progress = Progress::None, int poll_us = 50,
                                            const std::vector<int>& progress_cpus = {},
                                            Staging staging = Staging::Direct, int group_size = 0);

// Parses a comma list of CPU numbers ("" -> empty); throws std::invalid_argument naming
// the flag, the value and what is allowed.
std::vector<int> parse_cpu_list(const std::string& s, const std::string& flag);

// Why this process cannot use the NCCL backend ("" when it can): a build without
// MINICP_ENABLE_NCCL, no CUDA device visible, or more ranks on the node than GPUs (NCCL
// refuses two ranks on one device).
std::string nccl_unavailable(int ranks_on_node);
// NCCL backend (device buffers; MINICP_ENABLE_NCCL builds). Its world is every MPI rank, or
// with group_size > 0 the group of group_size consecutive ranks this rank belongs to (as
// make_mpi_comm). compute_stream: the cudaStream_t the tensors are computed on; each
// operation waits for the work queued there so far (an event, no host wait), or with none
// for the whole device. Throws std::runtime_error where nccl_unavailable() is not "".
std::unique_ptr<Communicator> make_nccl_comm(int group_size = 0, void* compute_stream = nullptr);

// Parses "none" / "thread"; throws std::invalid_argument naming the allowed values.
Progress parse_progress(const std::string& s);
// Parses "direct" / "host"; throws std::invalid_argument naming the allowed values.
Staging parse_staging(const std::string& s);

// Whether this MPI reads and writes device memory: Open MPI's MPIX_Query_cuda_support where
// its mpi-ext.h says it was built with CUDA, asked at run time; false for any other MPI.
bool mpi_device_aware();
// The staging for buffers in a memory space the host cannot (host_accessible false) or can
// read: Host when MPI cannot read that memory, else Direct. The driver and the benchmarks
// take it for their tensors' space, so no device pointer reaches an MPI that is not
// GPU-aware.
Staging staging_for(bool host_accessible);

}  // namespace minicp::comm
