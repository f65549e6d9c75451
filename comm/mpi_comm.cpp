// MPI backend of the communicator. Progress strategy (see comm.hpp): with Progress::Thread
// a helper thread calls MPI_Testall on every outstanding request each poll interval, so
// rendezvous transfers of large messages advance while the caller computes; wait() then
// finds them done. Needs MPI_THREAD_MULTIPLE (checked at construction). The thread can be
// pinned to a CPU of its own (progress_cpus), so that its message copies do not take
// time from a core that computes.
#include <mpi.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <functional>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <list>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "comm/comm.hpp"

namespace minicp::comm {

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I64: return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}
MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX; }
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
  double t_done = 0;
  std::vector<char> staging;     // received blocks of a reduce-scatter
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

}  // namespace

class MpiComm final : public Communicator {
 public:
  MpiComm(Progress progress, int poll_us, const std::vector<int>& progress_cpus) : poll_us_(poll_us) {
    progress_ = progress;
    int provided = 0;
    MPI_Query_thread(&provided);
    if (progress == Progress::Thread && provided < MPI_THREAD_MULTIPLE)
      throw std::runtime_error("progress=thread needs MPI initialised with MPI_THREAD_MULTIPLE");
    world_ = make_group(MPI_COMM_WORLD, "world", /*dup=*/true);
    if (progress == Progress::Thread) {
      thread_ = std::thread([this] { progress_loop(); });
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

  std::string backend() const override { return "mpi"; }
  double progress_busy_s() const override { return busy_s_; }

  Request isendrecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes, int src,
                    const Group& g, int step, int channel) override {
    if (channel < 0 || channel >= kChannels)
      throw std::invalid_argument("isendrecv channel " + std::to_string(channel) + " is outside 0.." +
                                  std::to_string(kChannels - 1));
    const int tag = kTagP2P + channel;
    auto r = std::make_shared<MpiRequest>();
    r->ev = Event{EventKind::SendRecv, dst, g.id, step, int64_t(send_bytes), 0, MPI_Wtime(), 0};
    r->reqs.resize(2);
    const Count rc = byte_count(recv_bytes, big_block_), sc = byte_count(send_bytes, big_block_);
    check(MPI_Irecv(recv, rc.n, rc.type, src, tag, comm_of(g), &r->reqs[0]), "Irecv");
    check(MPI_Isend(send, sc.n, sc.type, dst, tag, comm_of(g), &r->reqs[1]), "Isend");
    return post(r);
  }

  Request iallgather(const void* send, void* recv, size_t bytes, const Group& g, int step) override {
    auto r = std::make_shared<MpiRequest>();
    r->ev = Event{EventKind::AllGather, -1, g.id, step, int64_t(bytes), 0, MPI_Wtime(), 0};
    r->reqs.resize(1);
    const Count c = byte_count(bytes, big_block_);
    check(MPI_Iallgather(send, c.n, c.type, recv, c.n, c.type, comm_of(g), &r->reqs[0]), "Iallgather");
    return post(r);
  }

  Request ireduce_scatter(const void* send, void* recv, size_t count, DType t, const Group& g, int step) override {
    auto r = std::make_shared<MpiRequest>();
    r->ev = Event{EventKind::ReduceScatter, -1, g.id, step, int64_t(count * dtype_size(t) * g.size), 0, MPI_Wtime(),
                  0};
    // Direct algorithm over point-to-point messages (the fast shared-memory path; Open MPI's
    // MPI_Ireduce_scatter_block was 10x slower here for large buffers): block i goes to rank
    // i, received blocks are summed by wait(). Host buffers only (the sum runs on the host).
    const size_t es = dtype_size(t), blk = count * es;
    const int P = g.size, me = g.rank;
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
    r->finish = [raw, own, recv, count, t, P] {
      switch (t) {
        case DType::F32: sum_blocks<float>(own, raw->staging.data(), P - 1, count, recv); break;
        case DType::F64: sum_blocks<double>(own, raw->staging.data(), P - 1, count, recv); break;
        case DType::I64: sum_blocks<int64_t>(own, raw->staging.data(), P - 1, count, recv); break;
      }
    };
    return post(r);
  }

  void alltoall(const void* send, void* recv, size_t bytes_per_rank, const Group& g, int step) override {
    const double t0 = MPI_Wtime();
    const Count c = byte_count(bytes_per_rank, big_block_);
    check(MPI_Alltoall(send, c.n, c.type, recv, c.n, c.type, comm_of(g)), "Alltoall");
    trace_.add(Event{EventKind::AllToAll, -1, g.id, step, int64_t(bytes_per_rank * g.size), 0, t0, MPI_Wtime()});
  }

  void alltoallv(const void* send, const std::vector<size_t>& send_bytes, const std::vector<size_t>& send_displ,
                 void* recv, const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_displ,
                 const Group& g, int step) override {
    const double t0 = MPI_Wtime();
    const size_t n = size_t(g.size);
    if (send_bytes.size() != n || send_displ.size() != n || recv_bytes.size() != n || recv_displ.size() != n)
      throw std::invalid_argument("alltoallv: counts and displacements need one entry per group rank");
    // MPI_Alltoallv takes int counts and displacements (bytes here).
    std::vector<int> si(n), sdi(n), ri(n), rdi(n);
    int64_t total = 0;
    for (size_t i = 0; i < n; ++i) {
      if (send_displ[i] + send_bytes[i] > size_t(INT32_MAX) || recv_displ[i] + recv_bytes[i] > size_t(INT32_MAX))
        throw std::invalid_argument("alltoallv: buffers over 2 GiB are not supported");
      si[i] = int(send_bytes[i]);
      sdi[i] = int(send_displ[i]);
      ri[i] = int(recv_bytes[i]);
      rdi[i] = int(recv_displ[i]);
      total += int64_t(send_bytes[i]);
    }
    check(MPI_Alltoallv(send, si.data(), sdi.data(), MPI_BYTE, recv, ri.data(), rdi.data(), MPI_BYTE, comm_of(g)),
          "Alltoallv");
    trace_.add(Event{EventKind::AllToAllV, -1, g.id, step, total, 0, t0, MPI_Wtime()});
  }

  void allreduce(void* buf, size_t count, DType t, ReduceOp op, const Group& g, int step) override {
    const double t0 = MPI_Wtime();
    if (count > size_t(INT32_MAX)) throw std::invalid_argument("allreduce count over 2^31");
    check(MPI_Allreduce(MPI_IN_PLACE, buf, int(count), mpi_type(t), mpi_op(op), comm_of(g)), "Allreduce");
    trace_.add(Event{EventKind::AllReduce, -1, g.id, step, int64_t(count * dtype_size(t)), 0, t0, MPI_Wtime()});
  }

  void barrier(const Group& g) override {
    const double t0 = MPI_Wtime();
    check(MPI_Barrier(comm_of(g)), "Barrier");
    trace_.add(Event{EventKind::Barrier, -1, g.id, -1, 0, 0, t0, MPI_Wtime()});
  }

  void wait(Request& req) override {
    if (!req.state) return;
    auto r = std::static_pointer_cast<MpiRequest>(req.state);
    const double t0 = MPI_Wtime();
    if (thread_.joinable()) {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.remove(r);
    }
    if (!r->done) {
      check(MPI_Waitall(int(r->reqs.size()), r->reqs.data(), MPI_STATUSES_IGNORE), "Waitall");
      r->t_done = MPI_Wtime();
      r->done = true;
    }
    if (r->finish) {
      r->finish();
      r->t_done = MPI_Wtime();
    }
    const double t1 = MPI_Wtime();
    Event ev = r->ev;
    ev.t_end = r->t_done;
    trace_.add(ev);
    trace_.add(Event{EventKind::Wait, ev.peer, ev.group, ev.step, 0, 0, t0, t1});
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
    g.native = owned.get();
    comms_.push_back(std::move(owned));
    return g;
  }

  // Pins the progress thread to progress_cpus[local rank mod size].
  void pin_progress_thread(const std::vector<int>& cpus) {
    MPI_Comm node;
    check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "Comm_split_type");
    int local = 0;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    const int cpu = cpus[size_t(local) % cpus.size()];
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    const int rc = pthread_setaffinity_np(thread_.native_handle(), sizeof set, &set);
    if (rc != 0) {
      stop_thread();
      throw std::invalid_argument("progress CPU " + std::to_string(cpu) + " cannot be used on this node (" +
                                  std::strerror(rc) + "); allowed: an online CPU of this process's cpuset");
    }
  }

  void stop_thread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
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
  // every poll_us while something is.
  void progress_loop() {
    while (!stop_) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !pending_.empty(); });
        if (stop_) break;
        for (auto it = pending_.begin(); it != pending_.end();) {
          int flag = 0;
          const double t0 = MPI_Wtime();
          MPI_Testall(int((*it)->reqs.size()), (*it)->reqs.data(), &flag, MPI_STATUSES_IGNORE);
          busy_s_ = busy_s_ + (MPI_Wtime() - t0);
          if (flag) {
            (*it)->t_done = MPI_Wtime();
            (*it)->done = true;
            it = pending_.erase(it);
          } else {
            ++it;
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(poll_us_));
    }
  }

  int poll_us_;
  std::vector<std::unique_ptr<MPI_Comm>> comms_;
  MPI_Datatype big_block_ = MPI_DATATYPE_NULL;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<double> busy_s_{0};
  std::list<std::shared_ptr<MpiRequest>> pending_;
};

std::unique_ptr<Communicator> make_mpi_comm(Progress progress, int poll_us, const std::vector<int>& progress_cpus) {
  if (!progress_cpus.empty() && progress != Progress::Thread)
    throw std::invalid_argument("progress CPUs need progress=thread (got progress=none)");
  return std::make_unique<MpiComm>(progress, poll_us, progress_cpus);
}

}  // namespace minicp::comm
