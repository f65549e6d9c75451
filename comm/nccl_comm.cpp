// NCCL backend of the communicator (built with MINICP_ENABLE_NCCL): buffers are device
// pointers; every operation is enqueued on one CUDA stream and completed by wait() on a
// CUDA event recorded after it. MPI bootstraps the NCCL communicators and their splits.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

#include "comm/comm.hpp"
#include "comm/mpi_group.hpp"

namespace minicp::comm {
namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}
void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string("NCCL ") + what + ": " + ncclGetErrorString(r));
}
ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::I64: return ncclInt64;
    case DType::BF16: return ncclBfloat16;
  }
  return ncclFloat32;
}

struct NcclRequest : RequestState {
  cudaEvent_t done = nullptr;
  Event ev{};
  ~NcclRequest() override {
    if (done) cudaEventDestroy(done);
  }
};

}  // namespace

class NcclComm final : public Communicator {
 public:
  NcclComm(int group_size, cudaStream_t compute) : compute_(compute) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
      throw std::runtime_error("nccl backend: no CUDA device visible");
    topology_ = node_topology();
    cuda_check(cudaSetDevice(topology_.local_rank % devices), "cudaSetDevice");
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ncclUniqueId id;
    if (rank == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t world;
    nccl_check(ncclCommInitRank(&world, size, id, rank), "ncclCommInitRank");
    MPI_Comm mworld;
    MPI_Comm_dup(MPI_COMM_WORLD, &mworld);
    world_ = make_group(world, mworld, "world", rank, size);
    if (group_size > 0 && group_size < size) {  // the group of consecutive ranks, as the MPI backend's
      world_ = split_color(rank / group_size, "world");
    }
    job_ = world_;
  }
  ~NcclComm() override {
    for (auto& c : comms_) ncclCommDestroy(*c);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
      for (auto& c : mpi_comms_) MPI_Comm_free(c.get());
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::string backend() const override { return "nccl"; }

  Request isendrecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes, int src,
                    const Group& g, int step,
                    int /*channel: NCCL matches sends and receives in stream order*/) override {
    auto r = start(posted(EventKind::SendRecv, dst, g, step, int64_t(send_bytes)));
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    nccl_check(ncclSend(send, send_bytes, ncclUint8, dst, nc(g), stream_), "ncclSend");
    nccl_check(ncclRecv(recv, recv_bytes, ncclUint8, src, nc(g), stream_), "ncclRecv");
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    return finish(r);
  }
  Request iallgather(const void* send, void* recv, size_t bytes, const Group& g, int step) override {
    auto r = start(posted(EventKind::AllGather, -1, g, step, int64_t(bytes)));
    nccl_check(ncclAllGather(send, recv, bytes, ncclUint8, nc(g), stream_), "ncclAllGather");
    return finish(r);
  }
  Request ireduce_scatter(const void* send, void* recv, size_t count, DType t, const Group& g, int step) override {
    auto r = start(posted(EventKind::ReduceScatter, -1, g, step, int64_t(count * dtype_size(t))));
    nccl_check(ncclReduceScatter(send, recv, count, nccl_type(t), ncclSum, nc(g), stream_), "ncclReduceScatter");
    return finish(r);
  }
  void alltoall(const void* send, void* recv, size_t bytes_per_rank, const Group& g, int step) override {
    std::vector<size_t> counts(g.size, bytes_per_rank), displ(g.size);
    for (int i = 0; i < g.size; ++i) displ[i] = bytes_per_rank * i;
    exchange(posted(EventKind::AllToAll, -1, g, step, int64_t(bytes_per_rank)), send, counts, displ, recv, counts,
             displ, g);
  }
  void alltoallv(const void* send, const std::vector<size_t>& send_bytes, const std::vector<size_t>& send_displ,
                 void* recv, const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_displ,
                 const Group& g, int step) override {
    exchange(posted(EventKind::AllToAllV, -1, g, step, to_others(send_bytes, g)), send, send_bytes, send_displ, recv,
             recv_bytes, recv_displ, g);
  }
  Request iallreduce(void* buf, size_t count, DType t, ReduceOp op, const Group& g, int step) override {
    auto r = start(posted(EventKind::AllReduce, -1, g, step, int64_t(count * dtype_size(t))));
    nccl_check(ncclAllReduce(buf, buf, count, nccl_type(t), op == ReduceOp::Sum ? ncclSum : ncclMax, nc(g), stream_),
               "ncclAllReduce");
    return finish(r);
  }
  void allreduce(void* buf, size_t count, DType t, ReduceOp op, const Group& g, int step) override {
    auto r = start(posted(EventKind::AllReduce, -1, g, step, int64_t(count * dtype_size(t))));
    nccl_check(ncclAllReduce(buf, buf, count, nccl_type(t), op == ReduceOp::Sum ? ncclSum : ncclMax, nc(g), stream_),
               "ncclAllReduce");
    Request q = finish(r);
    wait(q);
  }
  // An all-reduce of one float, recorded as the Barrier it stands for (no payload: 0 bytes).
  void barrier(const Group& g) override {
    float* scratch = barrier_buf();
    auto r = start(posted(EventKind::Barrier, -1, g, -1, 0));
    nccl_check(ncclAllReduce(scratch, scratch, 1, ncclFloat32, ncclSum, nc(g), stream_), "ncclAllReduce");
    Request q = finish(r);
    wait(q);
  }
  void wait(Request& req) override {
    if (!req.state) return;
    auto r = std::static_pointer_cast<NcclRequest>(req.state);
    const double t0 = MPI_Wtime();
    cuda_check(cudaEventSynchronize(r->done), "cudaEventSynchronize");
    const double t1 = MPI_Wtime();
    Event ev = r->ev;
    ev.t_end = t1;
    trace_.add(ev);
    trace_.add(wait_event(ev, t0, t1));
    req.state.reset();
  }

 private:
  ncclComm_t nc(const Group& g) const { return *static_cast<ncclComm_t*>(g.native); }

  Group split_color(int color, const std::string& name) override { return split_of(world_, color, name); }
  Group split_job_color(int color, const std::string& name) override { return split_of(job_, color, name); }
  Group split_of(const Group& parent, int color, const std::string& name) {
    ncclComm_t c;
    nccl_check(ncclCommSplit(nc(parent), color, parent.rank, &c, nullptr), "ncclCommSplit");
    int rank = 0, size = 1;
    ncclCommUserRank(c, &rank);
    ncclCommCount(c, &size);
    MPI_Comm m;  // the same split over MPI, for Group::mpi
    MPI_Comm_split(mpi_of(parent), color, parent.rank, &m);
    return make_group(c, m, name, rank, size);
  }
  Group make_group(ncclComm_t c, MPI_Comm m, const std::string& name, int rank, int size) {
    auto owned = std::make_unique<ncclComm_t>(c);
    auto owned_mpi = std::make_unique<MPI_Comm>(m);
    Group g;
    g.id = int(comms_.size());
    g.name = name;
    g.rank = rank;
    g.size = size;
    g.native = owned.get();
    g.mpi = owned_mpi.get();
    int wr = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    g.world_ranks.resize(size_t(size));
    MPI_Allgather(&wr, 1, MPI_INT, g.world_ranks.data(), 1, MPI_INT, m);
    comms_.push_back(std::move(owned));
    mpi_comms_.push_back(std::move(owned_mpi));
    return g;
  }
  // A request for the operation whose event `posted` just built.
  // Also orders the operation after the compute queued so far: its buffers are ready.
  std::shared_ptr<NcclRequest> start(const Event& ev) {
    if (compute_) {
      cuda_check(cudaEventRecord(ready_, compute_), "cudaEventRecord");
      cuda_check(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
    } else {
      cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
    auto r = std::make_shared<NcclRequest>();
    r->ev = ev;
    cuda_check(cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming), "cudaEventCreate");
    return r;
  }
  Request finish(const std::shared_ptr<NcclRequest>& r) {
    cuda_check(cudaEventRecord(r->done, stream_), "cudaEventRecord");
    return Request{r};
  }
  void exchange(const Event& ev, const void* send, const std::vector<size_t>& sb, const std::vector<size_t>& sd,
                void* recv, const std::vector<size_t>& rb, const std::vector<size_t>& rd, const Group& g) {
    auto r = start(ev);
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < g.size; ++p) {
      nccl_check(ncclSend(static_cast<const char*>(send) + sd[p], sb[p], ncclUint8, p, nc(g), stream_), "ncclSend");
      nccl_check(ncclRecv(static_cast<char*>(recv) + rd[p], rb[p], ncclUint8, p, nc(g), stream_), "ncclRecv");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    Request q = finish(r);
    wait(q);
  }
  float*& barrier_buf() {
    if (!barrier_) cuda_check(cudaMalloc(reinterpret_cast<void**>(&barrier_), sizeof(float)), "cudaMalloc");
    return barrier_;
  }

  cudaStream_t stream_ = nullptr;   // the operations'
  cudaStream_t compute_ = nullptr;  // the tensors' (nullptr: unknown, the device is synchronised)
  cudaEvent_t ready_ = nullptr;     // compute_ up to an operation's start
  float* barrier_ = nullptr;
  std::vector<std::unique_ptr<ncclComm_t>> comms_;
  std::vector<std::unique_ptr<MPI_Comm>> mpi_comms_;  // Group::mpi of each group
};

std::unique_ptr<Communicator> make_nccl_comm(int group_size, void* compute_stream) {
  return std::make_unique<NcclComm>(group_size, static_cast<cudaStream_t>(compute_stream));
}

std::string nccl_unavailable(int ranks_on_node) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    return "no CUDA device is visible";
  }
  if (ranks_on_node > devices)
    return std::to_string(ranks_on_node) + " ranks on this node and " + std::to_string(devices) +
           " GPU(s): NCCL takes one rank per GPU (run at most that many ranks per node, or the MPI communicator)";
  return "";
}

}  // namespace minicp::comm
