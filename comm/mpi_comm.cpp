// MPI backend of the communicator. Progress strategy (see comm.hpp): with Progress::Thread
// a helper thread calls MPI_Testall on every outstanding request each poll interval, so
// rendezvous transfers of large messages advance while the caller computes; wait() then
// finds them done. Needs MPI_THREAD_MULTIPLE (checked at construction). The thread can be
// pinned to a CPU of its own (progress_cpus), so that its message copies do not take
// time from a core that computes. With Staging::Host every buffer goes through a host
// staging buffer (pooled), for device memory and an MPI that is not GPU-aware.
#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI: MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support
#endif
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "comm/comm.hpp"
#include "kernels/bf16.hpp"

#ifdef MINICP_ENABLE_NCCL
#include <cuda_runtime.h>
#endif

namespace minicp::comm {

namespace {

#ifdef MINICP_ENABLE_NCCL
bool is_device_ptr(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // no device, or a plain host pointer on old runtimes
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}
#endif

// Copies bytes between a caller's buffer (host or device memory) and host staging memory.
void stage_copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
#ifdef MINICP_ENABLE_NCCL
  if (is_device_ptr(dst) || is_device_ptr(src)) {
    const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    if (e != cudaSuccess)
      throw std::runtime_error(std::string("host staging: cudaMemcpy failed: ") + cudaGetErrorString(e));
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

// A host staging buffer (uninitialised bytes).
struct HostBuf {
  std::unique_ptr<char[]> p;
  size_t cap = 0;
  char* data() { return p.get(); }
};

using kernels::bf16;

// MPI has no bfloat16: BF16 buffers travel as 16-bit integers and are reduced by user
// operations that widen each pair to fp32, combine, and round once to nearest even (one
// rounding per element and per reduction step, as a bf16 all-reduce on the wire does).
template <bool Sum>
void bf16_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const bf16* a = static_cast<const bf16*>(in);
  bf16* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = a[i], y = b[i];
    if (Sum)
      b[i] = x + y;
    else if (x > y)
      b[i] = a[i];
  }
}
MPI_Op bf16_op(ReduceOp op) {
  static MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL;  // created once, on first use (after MPI_Init)
  static std::once_flag once;
  std::call_once(once, [] {
    MPI_Op_create(&bf16_reduce<true>, /*commute=*/1, &sum);
    MPI_Op_create(&bf16_reduce<false>, /*commute=*/1, &max);
  });
  return op == ReduceOp::Sum ? sum : max;
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I64: return MPI_INT64_T;
    case DType::BF16: return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}
MPI_Op mpi_op(ReduceOp op, DType t) {
  if (t == DType::BF16) return bf16_op(op);
  return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX;
}
MPI_Comm comm_of(const Group& g) { return *static_cast<MPI_Comm*>(g.native); }

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw std::runtime_error(std::string("MPI ") + what + " failed: " + std::string(msg, len));
  }
}

// Byte counts above INT_MAX are sent as blocks of 1 MiB elements.
struct Count {
  int n;
  MPI_Datatype type;
};
Count byte_count(size_t bytes, MPI_Datatype& block) {
  constexpr size_t kBlock = 1 << 20;
  if (bytes <= size_t(INT32_MAX)) return {int(bytes), MPI_BYTE};
  if (bytes % kBlock != 0) throw std::invalid_argument("message over 2 GiB must be a multiple of 1 MiB");
  if (block == MPI_DATATYPE_NULL) {
    MPI_Type_contiguous(int(kBlock), MPI_BYTE, &block);
    MPI_Type_commit(&block);
  }
  return {int(bytes / kBlock), block};
}

struct MpiRequest : RequestState {
  std::vector<MPI_Request> reqs;
  Event ev{};
  std::atomic<bool> done{false};
  bool on_worker = false;  // run by the collective thread (done is set there), not by MPI requests
  double t_done = 0;
  // Serialises the completion calls on reqs (MPI forbids two at once on one request): the
  // progress thread tests under it, wait() completes under it.
  std::mutex test_mu;
  std::vector<char> staging;     // received blocks of a reduce-scatter
  std::vector<HostBuf> host;     // host staging buffers (Staging::Host), back to the pool after wait
  std::function<void()> finish;  // run by wait() once the transfers are complete
};

// recv[count] = own[count] + sum of the nblocks blocks of count elements at staging.
template <class T>
void sum_blocks(const void* own, const char* staging, int nblocks, size_t count, void* recv) {
  const T* a = static_cast<const T*>(own);
  T* out = static_cast<T*>(recv);
  for (size_t i = 0; i < count; ++i) out[i] = a[i];
  for (int b = 0; b < nblocks; ++b) {
    const T* x = reinterpret_cast<const T*>(staging) + size_t(b) * count;
    for (size_t i = 0; i < count; ++i) out[i] += x[i];
  }
}
// bf16 blocks: summed in fp32 and rounded once (the direct reduce-scatter is one step).
template <>
void sum_blocks<bf16>(const void* own, const char* staging, int nblocks, size_t count, void* recv) {
  const bf16* a = static_cast<const bf16*>(own);
  const bf16* x = reinterpret_cast<const bf16*>(staging);
  bf16* out = static_cast<bf16*>(recv);
  for (size_t i = 0; i < count; ++i) {
    float sum = a[i];
    for (int b = 0; b < nblocks; ++b) sum += float(x[size_t(b) * count + i]);
    out[i] = sum;
  }
}

}  // namespace

class MpiComm final : public Communicator {
 public:
  MpiComm(Progress progress, int poll_us, const std::vector<int>& progress_cpus, Staging staging, int group_size)
      : poll_us_(poll_us), staged_(staging == Staging::Host) {
    progress_ = progress;
    int provided = 0;
    MPI_Query_thread(&provided);
    if (progress == Progress::Thread && provided < MPI_THREAD_MULTIPLE)
      throw std::runtime_error("progress=thread needs MPI initialised with MPI_THREAD_MULTIPLE");
    if (group_size > 0) {
      int wr = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &wr);
      MPI_Comm c;
      check(MPI_Comm_split(MPI_COMM_WORLD, wr / group_size, wr, &c), "Comm_split");
      world_ = make_group(c, "world", /*dup=*/false);
    } else {
      world_ = make_group(MPI_COMM_WORLD, "world", /*dup=*/true);
    }
    job_ = world_;
    topology_ = node_topology(world_.native);
    if (progress == Progress::Thread) {
      thread_ = std::thread([this] { progress_loop(); });
      coll_thread_ = std::thread([this] { collective_loop(); });
      if (!progress_cpus.empty()) pin_progress_thread(progress_cpus);
    }
  }

  ~MpiComm() override {
    stop_thread();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      for (auto& c : comms_) MPI_Comm_free(c.get());
      if (big_block_ != MPI_DATATYPE_NULL) MPI_Type_free(&big_block_);
    }
  }

  std::string backend() const override { return staged_ ? "mpi-staged" : "mpi"; }
  double progress_busy_s() const override { return busy_s_; }
  double collective_busy_s() const override {
    return coll_thread_.joinable() ? coll_busy_s_.load() : std::numeric_limits<double>::quiet_NaN();
  }

  Request isendrecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes, int src,
                    const Group& g, int step, int channel) override {
    if (channel < 0 || channel >= kChannels)
      throw std::invalid_argument("isendrecv channel " + std::to_string(channel) + " is outside 0.." +
                                  std::to_string(kChannels - 1));
    const int tag = kTagP2P + channel;
    auto r = std::make_shared<MpiRequest>();
    r->ev = posted(EventKind::SendRecv, dst, g, step, int64_t(send_bytes));
    r->reqs.resize(2);
    if (staged_) {
      send = stage_in(*r, send, send_bytes);
      recv = stage_out(*r, recv, recv_bytes);
    }
    const Count rc = byte_count(recv_bytes, big_block_), sc = byte_count(send_bytes, big_block_);
    check(MPI_Irecv(recv, rc.n, rc.type, src, tag, comm_of(g), &r->reqs[0]), "Irecv");
    check(MPI_Isend(send, sc.n, sc.type, dst, tag, comm_of(g), &r->reqs[1]), "Isend");
    return post(r);
  }

  Request iallgather(const void* send, void* recv, size_t bytes, const Group& g, int step) override {
    auto r = std::make_shared<MpiRequest>();
    r->ev = posted(EventKind::AllGather, -1, g, step, int64_t(bytes));
    r->reqs.resize(1);
    if (staged_) {
      send = stage_in(*r, send, bytes);
      recv = stage_out(*r, recv, bytes * size_t(g.size));
    }
    const Count c = byte_count(bytes, big_block_);
    check(MPI_Iallgather(send, c.n, c.type, recv, c.n, c.type, comm_of(g), &r->reqs[0]), "Iallgather");
    return post(r);
  }

  Request ireduce_scatter(const void* send, void* recv, size_t count, DType t, const Group& g, int step) override {
    auto r = std::make_shared<MpiRequest>();
    r->ev = posted(EventKind::ReduceScatter, -1, g, step, int64_t(count * dtype_size(t)));
    // Direct algorithm over point-to-point messages (the fast shared-memory path; Open MPI's
    // MPI_Ireduce_scatter_block was 10x slower here for large buffers): block i goes to rank
    // i, received blocks are summed by wait() on the host: direct staging needs host buffers,
    // Staging::Host takes any.
    const size_t es = dtype_size(t), blk = count * es;
    const int P = g.size, me = g.rank;
    if (staged_) {
      send = stage_in(*r, send, blk * size_t(P));
      recv = stage_out(*r, recv, blk);
    }
    r->staging.resize(size_t(P - 1) * blk);
    r->reqs.reserve(2 * size_t(P - 1));
    const Count c = byte_count(blk, big_block_);
    for (int k = 1; k < P; ++k) {  // peers in ring order, so every rank starts with a different one
      const int from = (me - k + P) % P, to = (me + k) % P;
      MPI_Request rq, sq;
      check(MPI_Irecv(r->staging.data() + size_t(k - 1) * blk, c.n, c.type, from, kTagRS, comm_of(g), &rq), "Irecv");
      check(MPI_Isend(static_cast<const char*>(send) + size_t(to) * blk, c.n, c.type, to, kTagRS, comm_of(g), &sq),
            "Isend");
      r->reqs.push_back(rq);
      r->reqs.push_back(sq);
    }
    const void* own = static_cast<const char*>(send) + size_t(me) * blk;
    MpiRequest* raw = r.get();
    std::function<void()> copy_out = std::move(r->finish);  // Staging::Host: host result -> caller
    r->finish = [raw, own, recv, count, t, P, copy_out] {
      switch (t) {
        case DType::F32: sum_blocks<float>(own, raw->staging.data(), P - 1, count, recv); break;
        case DType::F64: sum_blocks<double>(own, raw->staging.data(), P - 1, count, recv); break;
        case DType::I64: sum_blocks<int64_t>(own, raw->staging.data(), P - 1, count, recv); break;
        case DType::BF16: sum_blocks<bf16>(own, raw->staging.data(), P - 1, count, recv); break;
      }
      if (copy_out) copy_out();
    };
    return post(r);
  }

  void alltoall(const void* send, void* recv, size_t bytes_per_rank, const Group& g, int step) override {
    Event ev = posted(EventKind::AllToAll, -1, g, step, int64_t(bytes_per_rank));
    const Count c = byte_count(bytes_per_rank, big_block_);
    MpiRequest st;  // host staging of a blocking call
    if (staged_) {
      send = stage_in(st, send, bytes_per_rank * size_t(g.size));
      recv = stage_out(st, recv, bytes_per_rank * size_t(g.size));
    }
    check(MPI_Alltoall(send, c.n, c.type, recv, c.n, c.type, comm_of(g)), "Alltoall");
    finish_staging(st);
    ev.t_end = MPI_Wtime();
    trace_.add(ev);
  }

  void alltoallv(const void* send, const std::vector<size_t>& send_bytes, const std::vector<size_t>& send_displ,
                 void* recv, const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_displ,
                 const Group& g, int step) override {
    const size_t n = size_t(g.size);
    if (send_bytes.size() != n || send_displ.size() != n || recv_bytes.size() != n || recv_displ.size() != n)
      throw std::invalid_argument("alltoallv: counts and displacements need one entry per group rank");
    // MPI_Alltoallv takes int counts and displacements (bytes here).
    std::vector<int> si(n), sdi(n), ri(n), rdi(n);
    for (size_t i = 0; i < n; ++i) {
      if (send_displ[i] + send_bytes[i] > size_t(INT32_MAX) || recv_displ[i] + recv_bytes[i] > size_t(INT32_MAX))
        throw std::invalid_argument("alltoallv: buffers over 2 GiB are not supported");
      si[i] = int(send_bytes[i]);
      sdi[i] = int(send_displ[i]);
      ri[i] = int(recv_bytes[i]);
      rdi[i] = int(recv_displ[i]);
    }
    Event ev = posted(EventKind::AllToAllV, -1, g, step, to_others(send_bytes, g));
    MpiRequest st;  // host staging of a blocking call: whole extents of both buffers
    if (staged_) {
      size_t send_end = 0, recv_end = 0;
      for (size_t i = 0; i < n; ++i) {
        send_end = std::max(send_end, send_displ[i] + send_bytes[i]);
        recv_end = std::max(recv_end, recv_displ[i] + recv_bytes[i]);
      }
      send = stage_in(st, send, send_end);
      st.host.push_back(take(recv_end));
      char* h = st.host.back().data();
      char* user = static_cast<char*>(recv);
      st.finish = [&recv_bytes, &recv_displ, h, user, n] {  // the blocks only: gaps stay untouched
        for (size_t i = 0; i < n; ++i) stage_copy(user + recv_displ[i], h + recv_displ[i], recv_bytes[i]);
      };
      recv = h;
    }
    check(MPI_Alltoallv(send, si.data(), sdi.data(), MPI_BYTE, recv, ri.data(), rdi.data(), MPI_BYTE, comm_of(g)),
          "Alltoallv");
    finish_staging(st);
    ev.t_end = MPI_Wtime();
    trace_.add(ev);
  }

  // With a progress thread the all-reduce runs as a blocking MPI_Allreduce on the collective
  // thread (on its own duplicate of the group's communicator, in post order on every rank):
  // Open MPI's non-blocking all-reduce (libnbc) took 180-300 ms for 45 MiB on 2 ranks of the
  // development VM, the blocking one 19 ms in 8 MiB pieces. Without one, MPI_Iallreduce.
  Request iallreduce(void* buf, size_t count, DType t, ReduceOp op, const Group& g, int step) override {
    if (count > size_t(INT32_MAX)) throw std::invalid_argument("iallreduce count over 2^31");
    auto r = std::make_shared<MpiRequest>();
    r->ev = posted(EventKind::AllReduce, -1, g, step, int64_t(count * dtype_size(t)));
    void* b = buf;
    if (staged_) {
      b = stage_out(*r, buf, count * dtype_size(t));
      stage_copy(b, buf, count * dtype_size(t));
    }
    if (coll_thread_.joinable()) {
      const MPI_Comm c = collective_comm(g);
      const MPI_Datatype type = mpi_type(t);
      const MPI_Op o = mpi_op(op, t);
      r->on_worker = true;
      {
        std::lock_guard<std::mutex> lock(coll_mu_);
        coll_q_.push_back({r, [b, count, type, o, c] {
                             check(MPI_Allreduce(MPI_IN_PLACE, b, int(count), type, o, c),
                                   "Allreduce (collective thread)");
                           }});
      }
      coll_cv_.notify_all();
      return Request{r};
    }
    r->reqs.resize(1);
    check(MPI_Iallreduce(MPI_IN_PLACE, b, int(count), mpi_type(t), mpi_op(op, t), comm_of(g), &r->reqs[0]),
          "Iallreduce");
    return post(r);
  }

  void allreduce(void* buf, size_t count, DType t, ReduceOp op, const Group& g, int step) override {
    if (count > size_t(INT32_MAX)) throw std::invalid_argument("allreduce count over 2^31");
    Event ev = posted(EventKind::AllReduce, -1, g, step, int64_t(count * dtype_size(t)));
    MpiRequest st;  // host staging of a blocking call (in place: in and out)
    void* b = buf;
    if (staged_) {
      b = stage_out(st, buf, count * dtype_size(t));
      stage_copy(b, buf, count * dtype_size(t));
    }
    check(MPI_Allreduce(MPI_IN_PLACE, b, int(count), mpi_type(t), mpi_op(op, t), comm_of(g)), "Allreduce");
    finish_staging(st);
    ev.t_end = MPI_Wtime();
    trace_.add(ev);
  }

  void barrier(const Group& g) override {
    Event ev = posted(EventKind::Barrier, -1, g, -1, 0);
    check(MPI_Barrier(comm_of(g)), "Barrier");
    ev.t_end = MPI_Wtime();
    trace_.add(ev);
  }

  void wait(Request& req) override {
    if (!req.state) return;
    auto r = std::static_pointer_cast<MpiRequest>(req.state);
    const double t0 = MPI_Wtime();
    if (thread_.joinable()) {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.remove(r);
    }
    if (r->on_worker) {
      std::unique_lock<std::mutex> lock(coll_mu_);
      coll_cv_.wait(lock, [&] { return r->done.load(); });
    } else {
      std::lock_guard<std::mutex> test(r->test_mu);  // the progress thread may be testing it now
      if (!r->done) {
        check(MPI_Waitall(int(r->reqs.size()), r->reqs.data(), MPI_STATUSES_IGNORE), "Waitall");
        r->t_done = MPI_Wtime();
        r->done = true;
      }
    }
    if (r->finish) {
      r->finish();
      r->t_done = MPI_Wtime();
    }
    for (auto& h : r->host) give(std::move(h));
    r->host.clear();
    const double t1 = MPI_Wtime();
    Event ev = r->ev;
    ev.t_end = r->t_done;
    trace_.add(ev);
    trace_.add(wait_event(ev, t0, t1));
    req.state.reset();
  }

 private:
  static constexpr int kTagP2P = 1000;  // isendrecv: kTagP2P + channel
  static constexpr int kTagRS = 4243;   // reduce-scatter blocks

  Group split_color(int color, const std::string& name) override {
    MPI_Comm c;
    check(MPI_Comm_split(comm_of(world_), color, world_.rank, &c), "Comm_split");
    return make_group(c, name, /*dup=*/false);
  }
  Group split_job_color(int color, const std::string& name) override {
    MPI_Comm c;
    check(MPI_Comm_split(comm_of(job_), color, job_.rank, &c), "Comm_split");
    return make_group(c, name, /*dup=*/false);
  }

  Group make_group(MPI_Comm c, const std::string& name, bool dup) {
    auto owned = std::make_unique<MPI_Comm>();
    if (dup)
      check(MPI_Comm_dup(c, owned.get()), "Comm_dup");
    else
      *owned = c;
    Group g;
    g.id = int(comms_.size());
    g.name = name;
    MPI_Comm_rank(*owned, &g.rank);
    MPI_Comm_size(*owned, &g.size);
    int wr = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    g.world_ranks.resize(g.size);
    MPI_Allgather(&wr, 1, MPI_INT, g.world_ranks.data(), 1, MPI_INT, *owned);
    g.native = g.mpi = owned.get();
    comms_.push_back(std::move(owned));
    return g;
  }

  // Host staging (Staging::Host). take/give: a small pool of host buffers, so that large
  // messages do not pay page faults on every call (posting and waiting run on the caller's
  // thread only, so the pool needs no lock).
  HostBuf take(size_t bytes) {
    size_t best = pool_.size();
    for (size_t i = 0; i < pool_.size(); ++i)
      if (pool_[i].cap >= bytes && (best == pool_.size() || pool_[i].cap < pool_[best].cap)) best = i;
    if (best < pool_.size()) {
      HostBuf b = std::move(pool_[best]);
      pool_.erase(pool_.begin() + long(best));
      return b;
    }
    HostBuf b;
    b.p.reset(new char[bytes > 0 ? bytes : 1]);
    b.cap = bytes;
    return b;
  }
  void give(HostBuf&& b) {
    pool_.push_back(std::move(b));
    if (pool_.size() > 16) pool_.erase(pool_.begin());  // bounded: the oldest goes
  }
  // A host copy of the caller's send buffer, owned by r.
  const void* stage_in(MpiRequest& r, const void* user, size_t bytes) {
    r.host.push_back(take(bytes));
    stage_copy(r.host.back().data(), user, bytes);
    return r.host.back().data();
  }
  // A host buffer MPI receives into; r.finish copies it to the caller's buffer.
  void* stage_out(MpiRequest& r, void* user, size_t bytes) {
    r.host.push_back(take(bytes));
    char* h = r.host.back().data();
    std::function<void()> prev = std::move(r.finish);
    r.finish = [prev, user, h, bytes] {
      if (prev) prev();
      stage_copy(user, h, bytes);
    };
    return h;
  }
  // End of a blocking staged call: copies out and returns the buffers to the pool.
  void finish_staging(MpiRequest& st) {
    if (st.finish) st.finish();
    for (auto& h : st.host) give(std::move(h));
    st.host.clear();
  }

  // Pins the progress thread to progress_cpus[local rank mod size].
  void pin_progress_thread(const std::vector<int>& cpus) {
    const int cpu = cpus[size_t(topology_.local_rank) % cpus.size()];
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    int rc = pthread_setaffinity_np(thread_.native_handle(), sizeof set, &set);
    if (rc == 0) rc = pthread_setaffinity_np(coll_thread_.native_handle(), sizeof set, &set);
    if (rc != 0) {
      stop_thread();
      throw std::invalid_argument("progress CPU " + std::to_string(cpu) + " cannot be used on this node (" +
                                  std::strerror(rc) + "); allowed: an online CPU of this process's cpuset");
    }
  }

  void stop_thread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::lock_guard<std::mutex> coll(coll_mu_);
      stop_ = true;
    }
    cv_.notify_one();
    coll_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (coll_thread_.joinable()) coll_thread_.join();
  }

  // The collective thread's duplicate of group g's communicator, made at the group's first
  // all-reduce (MPI_Comm_dup is collective: every rank reaches that call alike). Its own
  // communicator, so its blocking collectives never interleave with the caller's on g.
  MPI_Comm collective_comm(const Group& g) {
    auto it = coll_comms_.find(g.id);
    if (it != coll_comms_.end()) return *it->second;
    auto c = std::make_unique<MPI_Comm>();
    check(MPI_Comm_dup(comm_of(g), c.get()), "Comm_dup");
    const MPI_Comm out = *c;
    coll_comms_[g.id] = c.get();
    comms_.push_back(std::move(c));
    return out;
  }

  // Runs the queued collectives one after another, in post order.
  void collective_loop() {
    for (;;) {
      CollJob job;
      {
        std::unique_lock<std::mutex> lock(coll_mu_);
        coll_cv_.wait(lock, [this] { return stop_ || !coll_q_.empty(); });
        if (coll_q_.empty()) return;  // stopping, nothing left
        job = std::move(coll_q_.front());
        coll_q_.pop_front();
      }
      const double t0 = MPI_Wtime();
      job.run();
      busy_s_ = busy_s_ + (MPI_Wtime() - t0);
      coll_busy_s_ = coll_busy_s_ + (MPI_Wtime() - t0);
      {
        std::lock_guard<std::mutex> lock(coll_mu_);
        job.r->t_done = MPI_Wtime();
        job.r->done = true;
      }
      coll_cv_.notify_all();
    }
  }

  Request post(const std::shared_ptr<MpiRequest>& r) {
    if (thread_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        pending_.push_back(r);
      }
      cv_.notify_one();
    }
    return Request{r};
  }

  // Sleeps on cv_ while nothing is outstanding (so compute is not disturbed), and polls
  // every poll_us while something is. The list lock is held only to copy the list: a test
  // can run for milliseconds (Open MPI reduces and copies inside it), and a caller posting
  // or waiting must not queue behind it (a 45 MB all-reduce post once blocked 20-40 ms so).
  void progress_loop() {
    std::vector<std::shared_ptr<MpiRequest>> now;
    while (!stop_) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !pending_.empty(); });
        if (stop_) break;
        now.assign(pending_.begin(), pending_.end());
      }
      bool finished = false;
      for (const auto& r : now) {
        std::unique_lock<std::mutex> test(r->test_mu, std::try_to_lock);
        if (!test.owns_lock() || r->done) continue;  // wait() has it
        int flag = 0;
        const double t0 = MPI_Wtime();
        MPI_Testall(int(r->reqs.size()), r->reqs.data(), &flag, MPI_STATUSES_IGNORE);
        busy_s_ = busy_s_ + (MPI_Wtime() - t0);
        if (flag) r->t_done = MPI_Wtime(), r->done = true, finished = true;
      }
      now.clear();
      if (finished) {
        std::lock_guard<std::mutex> lock(mu_);
        pending_.remove_if([](const std::shared_ptr<MpiRequest>& r) { return r->done.load(); });
      }
      std::this_thread::sleep_for(std::chrono::microseconds(poll_us_));
    }
  }

  int poll_us_;
  bool staged_ = false;
  std::vector<HostBuf> pool_;
  std::vector<std::unique_ptr<MPI_Comm>> comms_;
  MPI_Datatype big_block_ = MPI_DATATYPE_NULL;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<double> busy_s_{0};
  std::atomic<double> coll_busy_s_{0};  // the collective thread's share of busy_s_
  std::list<std::shared_ptr<MpiRequest>> pending_;
  struct CollJob {
    std::shared_ptr<MpiRequest> r;
    std::function<void()> run;
  };
  std::thread coll_thread_;
  std::mutex coll_mu_;
  std::condition_variable coll_cv_;
  std::deque<CollJob> coll_q_;
  std::map<int, MPI_Comm*> coll_comms_;  // group id -> the collective thread's duplicate
};

std::unique_ptr<Communicator> make_mpi_comm(Progress progress, int poll_us, const std::vector<int>& progress_cpus,
                                            Staging staging, int group_size) {
  if (!progress_cpus.empty() && progress != Progress::Thread)
    throw std::invalid_argument("progress CPUs need progress=thread (got progress=none)");
  if (group_size < 0) throw std::invalid_argument("group_size must be >= 0");
  return std::make_unique<MpiComm>(progress, poll_us, progress_cpus, staging, group_size);
}

bool mpi_device_aware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

Staging staging_for(bool host_accessible) {
  return host_accessible || mpi_device_aware() ? Staging::Direct : Staging::Host;
}

}  // namespace minicp::comm
