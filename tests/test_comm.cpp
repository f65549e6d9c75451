// MPI tests of the communicator (comm/comm.hpp): the data every op delivers on the world and
// on split groups, under both progress modes, the trace events each call records and the
// bytes it counts as sent (comm::bytes_leaving). ctest runs it at np = 1, 2, 3, 4; the
// pair-group cases need an even rank count.
#include <gtest/gtest.h>
#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "comm/comm.hpp"
#include "comm/mesh.hpp"
#include "kernels/bf16.hpp"
#include "tests/mpi_util.hpp"

namespace minicp::comm {
// Names the progress mode in gtest's failure messages.
void PrintTo(Progress p, std::ostream* os) { *os << (p == Progress::None ? "none" : "thread"); }
}  // namespace minicp::comm

namespace {
namespace mc = minicp::comm;
namespace mk = minicp::kernels;
using mc::EventKind;

using minicp::test::world_rank;
using minicp::test::world_size;
MPI_Comm native(const mc::Group& g) { return *static_cast<MPI_Comm*>(g.native); }

// Deterministic byte stamped by (a, b, index): splitmix64 finaliser, so blocks from
// different ranks or for different peers differ.
uint8_t stamp(uint64_t a, uint64_t b, uint64_t i) {
  uint64_t z = i + a * 0x9E3779B97F4A7C15ull + b * 0xC2B2AE3D27D4EB4Full + 0x165667B19E3779F9ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<uint8_t>(z >> 56);
}
void fill(uint8_t* p, size_t n, uint64_t a, uint64_t b) {
  for (size_t i = 0; i < n; ++i) p[i] = stamp(a, b, i);
}
// Number of bytes of p[0..n) that differ from the stamp (a, b); first bad index in *first.
size_t mismatches(const uint8_t* p, size_t n, uint64_t a, uint64_t b, size_t* first) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i)
    if (p[i] != stamp(a, b, i) && bad++ == 0) *first = i;
  return bad;
}

constexpr size_t kGuard = 16;  // bytes after each receive buffer that must stay untouched
constexpr uint8_t kSentinel = 0xEE;
bool guard_intact(const uint8_t* p) {
  for (size_t i = 0; i < kGuard; ++i)
    if (p[i] != kSentinel) return false;
  return true;
}

// Checks one trace event (kind compared by name so failures read well).
void expect_event(const mc::Event& e, EventKind kind, const mc::Group& g, int64_t bytes, int step, int peer) {
  EXPECT_STREQ(mc::to_string(e.kind), mc::to_string(kind));
  EXPECT_EQ(e.group, g.id) << "group " << g.name;
  EXPECT_EQ(e.bytes, bytes) << mc::to_string(kind);
  EXPECT_EQ(e.step, step) << mc::to_string(kind);
  EXPECT_EQ(e.peer, peer) << mc::to_string(kind);
  EXPECT_GE(e.t_end, e.t_begin) << mc::to_string(kind);
  EXPECT_GE(e.t_begin, 0.0) << mc::to_string(kind);
}

// Exactly one event added since `before` (blocking ops), and it is the expected one. No
// ASSERT here: a failure must not skip the collectives that follow on this rank only.
void expect_one(const mc::Trace& t, size_t before, EventKind kind, const mc::Group& g, int64_t bytes, int step) {
  EXPECT_EQ(t.events().size(), before + 1) << mc::to_string(kind);
  if (t.events().size() == before + 1) expect_event(t.events()[before], kind, g, bytes, step, -1);
}

// After wait(): the op's event followed by a Wait event on the same group/step/peer.
void expect_waited(const mc::Trace& t, size_t before, EventKind kind, const mc::Group& g, int64_t bytes, int step,
                   int peer) {
  EXPECT_EQ(t.events().size(), before + 2) << "wait() adds the op's event and a Wait event";
  if (t.events().size() != before + 2) return;
  const mc::Event& op = t.events()[before];
  const mc::Event& w = t.events()[before + 1];
  expect_event(op, kind, g, bytes, step, peer);
  expect_event(w, EventKind::Wait, g, 0, step, peer);
  EXPECT_LE(op.t_begin, w.t_begin) << "posted before waited on";
  EXPECT_LE(op.t_end, w.t_end) << "complete before wait() returned";
}

// Progress strategy x staging: every data test runs on direct buffers with both progress
// strategies, and once more through host staging.
struct CommParam {
  mc::Progress progress;
  mc::Staging staging;
};
std::string param_name(const ::testing::TestParamInfo<CommParam>& p) {
  return std::string(p.param.progress == mc::Progress::None ? "none" : "thread") +
         (p.param.staging == mc::Staging::Host ? "_staged" : "");
}

// One communicator per test, with the groups the data tests loop over: the world and, when
// the rank count is even, pairs of consecutive ranks and pairs of ranks P/2 apart.
class Comm : public ::testing::TestWithParam<CommParam> {
 protected:
  void SetUp() override {
    c_ = mc::make_mpi_comm(GetParam().progress, 50, {}, GetParam().staging);
    groups_.push_back(c_->world());
    if (world_size() % 2 == 0) {
      groups_.push_back(c_->split_contiguous(2, "pair"));
      groups_.push_back(c_->split_strided(2, "strided"));
    }
  }
  mc::Trace& trace() { return c_->trace(); }

  std::unique_ptr<mc::Communicator> c_;
  std::vector<mc::Group> groups_;
};

// Host memory goes to MPI directly; device memory only to a GPU-aware MPI, else through host
// staging (an MPI built without CUDA support answers false, whatever the machine has).
TEST(Staging, DeviceMemoryIsStagedUnlessMpiIsGpuAware) {
  EXPECT_EQ(mc::staging_for(true), mc::Staging::Direct);
  EXPECT_EQ(mc::staging_for(false), mc::mpi_device_aware() ? mc::Staging::Direct : mc::Staging::Host);
#if defined(MPIX_CUDA_AWARE_SUPPORT) && !MPIX_CUDA_AWARE_SUPPORT
  EXPECT_FALSE(mc::mpi_device_aware());
#endif
}

TEST_P(Comm, GroupsMatchTheRankGrid) {
  const int P = world_size(), wr = world_rank();
  EXPECT_EQ(c_->backend(), GetParam().staging == mc::Staging::Host ? "mpi-staged" : "mpi");
  EXPECT_EQ(c_->progress(), GetParam().progress);
  const mc::Group& w = c_->world();
  EXPECT_EQ(w.id, 0);
  EXPECT_EQ(w.name, "world");
  EXPECT_EQ(w.rank, wr);
  EXPECT_EQ(w.size, P);
  std::vector<int> iota(P);
  for (int i = 0; i < P; ++i) iota[i] = i;
  EXPECT_EQ(w.world_ranks, iota);
  if (P % 2 == 0) {
    const mc::Group& pair = groups_[1];
    const mc::Group& strided = groups_[2];
    EXPECT_EQ(pair.name, "pair");
    EXPECT_EQ(pair.size, 2);
    EXPECT_EQ(pair.rank, wr % 2);
    EXPECT_EQ(pair.world_ranks, (std::vector<int>{wr / 2 * 2, wr / 2 * 2 + 1}));
    const int stride = P / 2;
    EXPECT_EQ(strided.name, "strided");
    EXPECT_EQ(strided.size, 2);
    EXPECT_EQ(strided.rank, wr / stride);
    EXPECT_EQ(strided.world_ranks, (std::vector<int>{wr % stride, wr % stride + stride}));
    EXPECT_NE(pair.id, w.id);
    EXPECT_NE(strided.id, w.id);
    EXPECT_NE(pair.id, strided.id);
  }
  // The degenerate splits: every rank alone, and everyone together.
  const mc::Group solo = c_->split_contiguous(1, "solo");
  EXPECT_EQ(solo.size, 1);
  EXPECT_EQ(solo.rank, 0);
  EXPECT_EQ(solo.world_ranks, std::vector<int>{wr});
  const mc::Group all = c_->split_strided(P, "all");
  EXPECT_EQ(all.size, P);
  EXPECT_EQ(all.rank, wr);
}

TEST_P(Comm, SplitRejectsSizeNotDividingRanks) {
  const int P = world_size();
  std::vector<int> bad = {0, -1, P + 1, 2 * P + 1};
  if (P % 2 == 1) bad.push_back(2);
  for (int size : bad) {
    for (int strided = 0; strided < 2; ++strided) {
      SCOPED_TRACE("size " + std::to_string(size) + (strided ? " strided" : " contiguous"));
      try {
        if (strided)
          c_->split_strided(size, "bad");
        else
          c_->split_contiguous(size, "bad");
        ADD_FAILURE() << "no exception";
      } catch (const std::invalid_argument& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("size " + std::to_string(size)), std::string::npos) << msg;
        EXPECT_NE(msg.find(std::to_string(P)), std::string::npos) << msg;
      }
    }
  }
}

// Ring step: every rank sends its stamped buffer to rank+1 and checks it got rank-1's.
TEST_P(Comm, SendRecvRing) {
  for (const mc::Group& g : groups_) {
    const int n = g.size, dst = (g.rank + 1) % n, src = (g.rank + n - 1) % n;
    for (size_t bytes : {size_t(0), size_t(1), size_t(13), size_t(4096), size_t(3) << 20}) {
      SCOPED_TRACE(g.name + " bytes " + std::to_string(bytes));
      std::vector<uint8_t> send(bytes + kGuard), recv(bytes + kGuard, kSentinel);
      fill(send.data(), bytes, uint64_t(g.rank), 1);
      const size_t before = trace().events().size();
      mc::Request r = c_->isendrecv(send.data(), bytes, dst, recv.data(), bytes, src, g, 3);
      EXPECT_TRUE(r.active());
      EXPECT_EQ(trace().events().size(), before) << "the event is recorded at wait()";
      c_->wait(r);
      EXPECT_FALSE(r.active());
      size_t first = 0;
      EXPECT_EQ(mismatches(recv.data(), bytes, uint64_t(src), 1, &first), 0u) << "first wrong byte " << first;
      EXPECT_TRUE(guard_intact(recv.data() + bytes));
      expect_waited(trace(), before, EventKind::SendRecv, g, n > 1 ? int64_t(bytes) : 0, 3, dst);  // to oneself: 0
    }
  }
}

// Several requests outstanding at once (both ring directions and an all-gather), completed
// in reverse order; waiting on a finished request does nothing.
// Two exchanges in flight between the same ranks, posted in opposite orders by even and
// odd ranks, each receive their own channel's message (one tag would pair them wrongly).
TEST_P(Comm, ChannelsKeepExchangesApartWhateverThePostingOrder) {
  for (const mc::Group& g : groups_) {
    SCOPED_TRACE(g.name);
    const int n = g.size, next = (g.rank + 1) % n, prev = (g.rank + n - 1) % n;
    const size_t b = size_t(256) << 10;
    std::vector<uint8_t> s0(b), s1(b), r0(b + kGuard, kSentinel), r1(b + kGuard, kSentinel);
    fill(s0.data(), b, g.rank, 10);
    fill(s1.data(), b, g.rank, 11);
    mc::Request q[2];
    for (int i = 0; i < 2; ++i) {
      const int ch = g.rank % 2 == 0 ? i : 1 - i;
      q[ch] = c_->isendrecv(ch ? s1.data() : s0.data(), b, next, ch ? r1.data() : r0.data(), b, prev, g, 0, ch);
    }
    c_->wait(q[1]);
    c_->wait(q[0]);
    size_t first = 0;
    EXPECT_EQ(mismatches(r0.data(), b, prev, 10, &first), 0u) << "channel 0, first wrong byte " << first;
    EXPECT_EQ(mismatches(r1.data(), b, prev, 11, &first), 0u) << "channel 1, first wrong byte " << first;
    EXPECT_TRUE(guard_intact(r0.data() + b));
    EXPECT_TRUE(guard_intact(r1.data() + b));
  }
  uint8_t x = 0, y = 0;
  EXPECT_THROW(c_->isendrecv(&x, 1, 0, &y, 1, 0, groups_[0], 0, mc::Communicator::kChannels), std::invalid_argument);
}

TEST_P(Comm, OutstandingRequestsCompleteInAnyOrder) {
  for (const mc::Group& g : groups_) {
    SCOPED_TRACE(g.name);
    const int n = g.size, next = (g.rank + 1) % n, prev = (g.rank + n - 1) % n;
    const size_t fb = size_t(1) << 20, bb = size_t(64) << 10, ab = 4096;
    std::vector<uint8_t> fs(fb), fr(fb + kGuard, kSentinel), bs(bb), br(bb + kGuard, kSentinel), as(ab),
        ar(ab * n + kGuard, kSentinel);
    fill(fs.data(), fb, g.rank, 2);
    fill(bs.data(), bb, g.rank, 3);
    fill(as.data(), ab, g.rank, 4);
    const size_t before = trace().events().size();
    mc::Request fwd = c_->isendrecv(fs.data(), fb, next, fr.data(), fb, prev, g, 0);
    mc::Request bwd = c_->isendrecv(bs.data(), bb, prev, br.data(), bb, next, g, 1);
    mc::Request gat = c_->iallgather(as.data(), ar.data(), ab, g, 2);
    c_->wait(gat);
    c_->wait(bwd);
    c_->wait(fwd);
    size_t first = 0;
    EXPECT_EQ(mismatches(fr.data(), fb, prev, 2, &first), 0u) << "forward, first wrong byte " << first;
    EXPECT_EQ(mismatches(br.data(), bb, next, 3, &first), 0u) << "backward, first wrong byte " << first;
    for (int s = 0; s < n; ++s) EXPECT_EQ(mismatches(ar.data() + s * ab, ab, s, 4, &first), 0u) << "gather block " << s;
    EXPECT_TRUE(guard_intact(fr.data() + fb));
    EXPECT_TRUE(guard_intact(br.data() + bb));
    EXPECT_TRUE(guard_intact(ar.data() + n * ab));
    const auto& ev = trace().events();
    EXPECT_EQ(ev.size(), before + 6);
    if (ev.size() != before + 6) continue;
    expect_event(ev[before + 0], EventKind::AllGather, g, int64_t(ab) * (n - 1), 2, -1);
    expect_event(ev[before + 2], EventKind::SendRecv, g, n > 1 ? int64_t(bb) : 0, 1, prev);
    expect_event(ev[before + 4], EventKind::SendRecv, g, n > 1 ? int64_t(fb) : 0, 0, next);
    for (int i : {1, 3, 5}) EXPECT_STREQ(mc::to_string(ev[before + i].kind), "wait");
    c_->wait(fwd);  // already complete: no-op
    EXPECT_EQ(trace().events().size(), before + 6);
  }
}

TEST_P(Comm, AllGather) {
  for (const mc::Group& g : groups_) {
    const int n = g.size;
    for (size_t bytes : {size_t(0), size_t(4), size_t(1000), size_t(256) << 10}) {
      SCOPED_TRACE(g.name + " bytes " + std::to_string(bytes));
      std::vector<uint8_t> send(bytes + 1), recv(bytes * n + kGuard, kSentinel);
      fill(send.data(), bytes, g.rank, 5);
      const size_t before = trace().events().size();
      mc::Request r = c_->iallgather(send.data(), recv.data(), bytes, g, 5);
      EXPECT_EQ(trace().events().size(), before);
      c_->wait(r);
      for (int s = 0; s < n; ++s) {
        size_t first = 0;
        EXPECT_EQ(mismatches(recv.data() + s * bytes, bytes, s, 5, &first), 0u)
            << "block of rank " << s << ", first wrong byte " << first;
      }
      EXPECT_TRUE(guard_intact(recv.data() + n * bytes));
      expect_waited(trace(), before, EventKind::AllGather, g, int64_t(bytes) * (n - 1), 5, -1);
    }
  }
}

template <class T>
void reduce_scatter_case(mc::Communicator& c, const mc::Group& g, mc::DType t) {
  static_assert(std::is_floating_point_v<T>);
  const int n = g.size;
  for (size_t count : {size_t(1), size_t(7), size_t(1000)}) {
    SCOPED_TRACE(g.name + " count " + std::to_string(count));
    // send[j] = (rank + 1) * (j + 1) / 4: exact in fp32 for these sizes, so the sum is exact.
    std::vector<T> send(count * n), recv(count + 1, T(-12345));
    for (size_t j = 0; j < send.size(); ++j) send[j] = T(g.rank + 1) * T(j + 1) * T(0.25);
    const size_t before = c.trace().events().size();
    mc::Request r = c.ireduce_scatter(send.data(), recv.data(), count, t, g, 6);
    c.wait(r);
    size_t bad = 0, first = 0;
    for (size_t k = 0; k < count; ++k) {
      const size_t j = size_t(g.rank) * count + k;
      const T expect = T(j + 1) * T(0.25) * T(n * (n + 1) / 2);
      if (recv[k] != expect && bad++ == 0) first = k;
    }
    EXPECT_EQ(bad, 0u) << "first wrong element " << first << ": " << recv[first];
    EXPECT_EQ(recv[count], T(-12345)) << "wrote past count";
    expect_waited(c.trace(), before, EventKind::ReduceScatter, g, int64_t(count * sizeof(T)) * (n - 1), 6, -1);
  }
}

TEST_P(Comm, ReduceScatterF32) {
  for (const mc::Group& g : groups_) reduce_scatter_case<float>(*c_, g, mc::DType::F32);
}
TEST_P(Comm, ReduceScatterF64) {
  for (const mc::Group& g : groups_) reduce_scatter_case<double>(*c_, g, mc::DType::F64);
}

// BF16 reductions widen to fp32, add, and round once to nearest even. Reduce-scatter inputs
// 1 + i/128 (exact in bf16) sum exactly in fp32, so the result must be that sum rounded once.
// All-reduce: small integers (every partial sum exact in bf16, whatever MPI's order), and on
// two ranks 1 + k/128 plus 1/256, a halfway case that must round to even.
TEST_P(Comm, Bf16SumsInFp32RoundedOnce) {
  using mk::bf16;
  for (const mc::Group& g : groups_) {
    SCOPED_TRACE(g.name);
    const int n = g.size;
    const size_t count = 300;
    auto rs_value = [](int rank, size_t j) { return bf16(1.0f + float((rank * 7 + j) % 128) / 128.0f); };
    std::vector<bf16> send(count * n), recv(count + 1, bf16(-3.0f));
    for (size_t j = 0; j < send.size(); ++j) send[j] = rs_value(g.rank, j);
    const size_t before = c_->trace().events().size();
    mc::Request r = c_->ireduce_scatter(send.data(), recv.data(), count, mc::DType::BF16, g, 6);
    c_->wait(r);
    size_t bad = 0;
    for (size_t k = 0; k < count; ++k) {
      float sum = 0;
      for (int q = 0; q < n; ++q) sum += float(rs_value(q, size_t(g.rank) * count + k));
      if (recv[k].bits != bf16(sum).bits && bad++ == 0)
        ADD_FAILURE() << "reduce-scatter element " << k << ": " << float(recv[k]) << ", want " << float(bf16(sum));
    }
    EXPECT_EQ(bad, 0u);
    EXPECT_EQ(float(recv[count]), -3.0f) << "wrote past count";
    expect_waited(c_->trace(), before, EventKind::ReduceScatter, g, int64_t(count * 2) * (n - 1), 6, -1);
    for (mc::ReduceOp op : {mc::ReduceOp::Sum, mc::ReduceOp::Max}) {
      std::vector<bf16> buf(count);
      auto ar_int = [](int rank, size_t k) { return float((rank + 1) * int(k % 7 + 1)); };
      for (size_t k = 0; k < count; ++k) buf[k] = ar_int(g.rank, k);
      c_->allreduce(buf.data(), count, mc::DType::BF16, op, g, 9);
      bad = 0;
      for (size_t k = 0; k < count; ++k) {
        float want = ar_int(0, k);
        for (int q = 1; q < n; ++q) want = op == mc::ReduceOp::Sum ? want + ar_int(q, k) : std::max(want, ar_int(q, k));
        if (float(buf[k]) != want && bad++ == 0) ADD_FAILURE() << "all-reduce element " << k << ": " << float(buf[k]);
      }
      EXPECT_EQ(bad, 0u);
    }
    if (n == 2) {
      std::vector<bf16> buf(128);
      for (size_t k = 0; k < buf.size(); ++k) buf[k] = g.rank == 0 ? 1.0f + float(k) / 128.0f : 1.0f / 256.0f;
      mc::Request ar = c_->iallreduce(buf.data(), buf.size(), mc::DType::BF16, mc::ReduceOp::Sum, g, 9);
      c_->wait(ar);
      for (size_t k = 0; k < buf.size(); ++k) {
        const float want = 1.0f + float(k + (k % 2)) / 128.0f;  // halfway: to the even mantissa
        EXPECT_EQ(float(buf[k]), want) << "halfway element " << k;
      }
    }
  }
}

TEST_P(Comm, AllToAll) {
  for (const mc::Group& g : groups_) {
    const int n = g.size;
    for (size_t bytes : {size_t(0), size_t(4), size_t(4096), size_t(64) << 10}) {
      SCOPED_TRACE(g.name + " bytes per rank " + std::to_string(bytes));
      // Block for peer d carries stamp (me, d); the block from s must carry (s, me).
      std::vector<uint8_t> send(bytes * n + 1), recv(bytes * n + kGuard, kSentinel);
      for (int d = 0; d < n; ++d) fill(send.data() + d * bytes, bytes, g.rank, 100 + d);
      const size_t before = trace().events().size();
      c_->alltoall(send.data(), recv.data(), bytes, g, 7);
      for (int s = 0; s < n; ++s) {
        size_t first = 0;
        EXPECT_EQ(mismatches(recv.data() + s * bytes, bytes, s, 100 + g.rank, &first), 0u)
            << "block from rank " << s << ", first wrong byte " << first;
      }
      EXPECT_TRUE(guard_intact(recv.data() + n * bytes));
      expect_one(trace(), before, EventKind::AllToAll, g, int64_t(bytes) * (n - 1), 7);  // the own block stays
    }
  }
}

// Unequal counts (some zero) and receive blocks separated by a gap that must stay untouched.
TEST_P(Comm, AllToAllVUnequalCounts) {
  for (const mc::Group& g : groups_) {
    SCOPED_TRACE(g.name);
    const int n = g.size, me = g.rank;
    auto count = [](int s, int d) { return size_t((s * 3 + d * 5 + 1) % 4) * 17 + (s == d ? 3 : 0); };
    auto value = [](int s, int d, size_t k) { return int64_t(s) * 1000000 + int64_t(d) * 10000 + int64_t(k); };
    constexpr int64_t kGap = -7777;
    std::vector<size_t> sb(n), sd(n), rb(n), rd(n);
    size_t soff = 0, roff = 0;
    int64_t sent = 0;
    for (int p = 0; p < n; ++p) {
      sb[p] = count(me, p) * sizeof(int64_t);
      sd[p] = soff;
      soff += sb[p];
      if (p != me) sent += int64_t(sb[p]);  // the block to itself stays
      rb[p] = count(p, me) * sizeof(int64_t);
      rd[p] = roff;
      roff += rb[p] + sizeof(int64_t);  // one-element gap after each block
    }
    std::vector<int64_t> send(soff / sizeof(int64_t) + 1), recv(roff / sizeof(int64_t) + 1, kGap);
    for (int d = 0; d < n; ++d)
      for (size_t k = 0; k < count(me, d); ++k) send[sd[d] / sizeof(int64_t) + k] = value(me, d, k);
    const size_t before = trace().events().size();
    c_->alltoallv(send.data(), sb, sd, recv.data(), rb, rd, g, 8);
    for (int s = 0; s < n; ++s) {
      const int64_t* blk = recv.data() + rd[s] / sizeof(int64_t);
      size_t bad = 0;
      for (size_t k = 0; k < count(s, me); ++k) bad += blk[k] != value(s, me, k);
      EXPECT_EQ(bad, 0u) << "block from rank " << s;
      EXPECT_EQ(blk[count(s, me)], kGap) << "gap after block from rank " << s;
    }
    expect_one(trace(), before, EventKind::AllToAllV, g, sent, 8);
  }
}

TEST_P(Comm, AllToAllVRejectsWrongLength) {
  const mc::Group& g = c_->world();
  std::vector<size_t> shortv(g.size + 1, 0), ok(g.size, 0);
  int64_t dummy = 0;
  EXPECT_THROW(c_->alltoallv(&dummy, shortv, ok, &dummy, ok, ok, g), std::invalid_argument);
}

// Values v(r, k) with negatives; 64-bit ones beyond 2^32 for I64. All sums are exact.
template <class T>
T ar_value(int r, size_t k) {
  T v = T(int64_t((r * 7 + k * 3) % 101) - 50);
  if constexpr (std::is_integral_v<T>) v += T(r + 1) << 40;
  return v;
}

// blocking: allreduce (one event); else iallreduce then wait (the op's event and a Wait).
template <class T>
void allreduce_case(mc::Communicator& c, const mc::Group& g, mc::DType t, mc::ReduceOp op, bool blocking) {
  const int n = g.size;
  for (size_t count : {size_t(1), size_t(5), size_t(1000)}) {
    SCOPED_TRACE(g.name + " count " + std::to_string(count) + (op == mc::ReduceOp::Sum ? " sum" : " max"));
    std::vector<T> buf(count + 1);
    for (size_t k = 0; k < count; ++k) buf[k] = ar_value<T>(g.rank, k);
    buf[count] = T(42);
    const size_t before = c.trace().events().size();
    if (blocking) {
      c.allreduce(buf.data(), count, t, op, g, 9);
    } else {
      mc::Request r = c.iallreduce(buf.data(), count, t, op, g, 9);
      c.wait(r);
    }
    size_t bad = 0, first = 0;
    for (size_t k = 0; k < count; ++k) {
      T expect = ar_value<T>(0, k);
      for (int r = 1; r < n; ++r)
        expect = op == mc::ReduceOp::Sum ? T(expect + ar_value<T>(r, k)) : std::max(expect, ar_value<T>(r, k));
      if (buf[k] != expect && bad++ == 0) first = k;
    }
    EXPECT_EQ(bad, 0u) << "first wrong element " << first;
    EXPECT_EQ(buf[count], T(42)) << "wrote past count";
    const int64_t bytes = 2 * (n - 1) * int64_t(count * sizeof(T)) / n;
    if (blocking)
      expect_one(c.trace(), before, EventKind::AllReduce, g, bytes, 9);
    else
      expect_waited(c.trace(), before, EventKind::AllReduce, g, bytes, 9, -1);
  }
}

TEST_P(Comm, AllReduceSumMax) {
  for (const mc::Group& g : groups_) {
    for (mc::ReduceOp op : {mc::ReduceOp::Sum, mc::ReduceOp::Max}) {
      for (bool blocking : {true, false}) {
        allreduce_case<float>(*c_, g, mc::DType::F32, op, blocking);
        allreduce_case<double>(*c_, g, mc::DType::F64, op, blocking);
        allreduce_case<int64_t>(*c_, g, mc::DType::I64, op, blocking);
      }
    }
  }
}

// Group rank 0 arrives late; no rank may leave the barrier before it entered. Times come from
// steady_clock (CLOCK_MONOTONIC, one clock per host; Open MPI's MPI_Wtime counts from a
// per-process origin), so only ranks on rank 0's host compare.
TEST_P(Comm, BarrierWaitsForLateRank) {
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  for (const mc::Group& g : groups_) {
    SCOPED_TRACE(g.name);
    char host0[MPI_MAX_PROCESSOR_NAME];
    std::memcpy(host0, host, sizeof host0);
    MPI_Bcast(host0, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, native(g));
    if (g.rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    using clock = std::chrono::steady_clock;
    const int64_t t_enter = clock::now().time_since_epoch().count();
    const size_t before = trace().events().size();
    c_->barrier(g);
    const int64_t t_exit = clock::now().time_since_epoch().count();
    int64_t enter0 = t_enter;
    MPI_Bcast(&enter0, 1, MPI_INT64_T, 0, native(g));
    if (std::strcmp(host0, host) == 0) {
      EXPECT_GE(t_exit, enter0) << "left the barrier before rank 0 came";
    }
    expect_one(trace(), before, EventKind::Barrier, g, 0, -1);
  }
}

// "Bytes sent" per call, restated here from its definition (comm/trace.hpp) rather than
// computed with bytes_leaving, so that a change to the definition fails here: for every op
// on the world and on split groups, the op's event carries those bytes, its Wait event 0,
// and bytes_sent() advances by exactly the sum of the events' bytes, non-blocking ops as
// soon as they are posted.
TEST_P(Comm, BytesSentFollowTheDefinition) {
  std::vector<mc::Group> groups = groups_;
  groups.push_back(c_->split_strided(world_size(), "all"));  // a split group at every np
  groups.push_back(c_->split_contiguous(1, "solo"));
  for (const mc::Group& g : groups) {
    SCOPED_TRACE(g.name + " of " + std::to_string(g.size));
    const int n = g.size, me = g.rank, next = (me + 1) % n, prev = (me + n - 1) % n;
    // Runs op (which posts one call of `kind`) and checks the events it added and bytes_sent().
    auto check = [&](EventKind kind, int64_t want, auto&& op) {
      const size_t before = trace().events().size();
      const int64_t sent0 = c_->bytes_sent();
      op(sent0);
      int64_t sum = 0;
      int calls = 0;
      for (size_t i = before; i < trace().events().size(); ++i) {
        const mc::Event& e = trace().events()[i];
        sum += e.bytes;
        if (e.kind == kind) {
          ++calls;
          EXPECT_EQ(e.bytes, want) << mc::to_string(kind);
        } else {
          EXPECT_EQ(e.bytes, 0) << mc::to_string(e.kind) << " event of a " << mc::to_string(kind);
        }
      }
      EXPECT_EQ(calls, 1) << mc::to_string(kind);
      EXPECT_EQ(c_->bytes_sent() - sent0, sum) << mc::to_string(kind) << ": bytes_sent() advances by the events' bytes";
      EXPECT_EQ(sum, want) << mc::to_string(kind);
    };
    // A non-blocking call counts its bytes when posted, before wait().
    auto posted = [&](mc::Request r, int64_t sent0, int64_t want, EventKind kind) {
      EXPECT_EQ(c_->bytes_sent() - sent0, want) << mc::to_string(kind) << " counted when posted";
      c_->wait(r);
    };

    std::vector<uint8_t> s(4096, 1), r(4096 * 4 + 64);
    const int64_t p2p = n > 1 ? 1000 : 0;  // the send size, 0 to oneself
    check(EventKind::SendRecv, p2p, [&](int64_t s0) {
      posted(c_->isendrecv(s.data(), 1000, next, r.data(), 1000, prev, g, 0), s0, p2p, EventKind::SendRecv);
    });
    const int64_t gathered = 333 * int64_t(n - 1);  // b (n-1)
    check(EventKind::AllGather, gathered, [&](int64_t s0) {
      posted(c_->iallgather(s.data(), r.data(), 333, g, 1), s0, gathered, EventKind::AllGather);
    });
    std::vector<float> rs32(7 * size_t(n), 1.0f), out32(7);
    const int64_t scattered32 = 7 * 4 * int64_t(n - 1);  // c e (n-1)
    check(EventKind::ReduceScatter, scattered32, [&](int64_t s0) {
      posted(c_->ireduce_scatter(rs32.data(), out32.data(), 7, mc::DType::F32, g, 2), s0, scattered32,
             EventKind::ReduceScatter);
    });
    std::vector<double> rs64(5 * size_t(n), 1.0), out64(5);
    const int64_t scattered64 = 5 * 8 * int64_t(n - 1);
    check(EventKind::ReduceScatter, scattered64, [&](int64_t s0) {
      posted(c_->ireduce_scatter(rs64.data(), out64.data(), 5, mc::DType::F64, g, 2), s0, scattered64,
             EventKind::ReduceScatter);
    });
    check(EventKind::AllToAll, 100 * int64_t(n - 1), [&](int64_t) { c_->alltoall(s.data(), r.data(), 100, g, 3); });
    // Unequal counts, the block to itself included: only the blocks to the others leave.
    std::vector<size_t> sb(n), sd(n), rb(n), rd(n);
    int64_t to_others = 0;
    for (int p = 0; p < n; ++p) {
      sb[p] = size_t(8 * (me + 2 * p + 1));
      rb[p] = size_t(8 * (p + 2 * me + 1));
      sd[p] = p > 0 ? sd[p - 1] + sb[p - 1] : 0;
      rd[p] = p > 0 ? rd[p - 1] + rb[p - 1] : 0;
      if (p != me) to_others += int64_t(sb[p]);
    }
    check(EventKind::AllToAllV, to_others, [&](int64_t) { c_->alltoallv(s.data(), sb, sd, r.data(), rb, rd, g, 4); });
    // 2 (n-1) p / n, rounded down: p = 20 at n = 3 gives 26.
    std::vector<float> ar32(5, 1.0f);
    check(EventKind::AllReduce, 2 * int64_t(n - 1) * 20 / n,
          [&](int64_t) { c_->allreduce(ar32.data(), 5, mc::DType::F32, mc::ReduceOp::Sum, g, 5); });
    std::vector<int64_t> ar64(3, 1);
    check(EventKind::AllReduce, 2 * int64_t(n - 1) * 24 / n,
          [&](int64_t) { c_->allreduce(ar64.data(), 3, mc::DType::I64, mc::ReduceOp::Max, g, 5); });
    check(EventKind::Barrier, 0, [&](int64_t) { c_->barrier(g); });
  }
}

// The definition itself, on numbers (comm/trace.hpp).
TEST(CommBytes, LeavingPerKind) {
  using mc::bytes_leaving;
  EXPECT_EQ(bytes_leaving(EventKind::SendRecv, 100, 4), 100);
  EXPECT_EQ(bytes_leaving(EventKind::AllGather, 100, 4), 300);
  EXPECT_EQ(bytes_leaving(EventKind::ReduceScatter, 100, 4), 300);
  EXPECT_EQ(bytes_leaving(EventKind::AllToAll, 100, 4), 300);
  EXPECT_EQ(bytes_leaving(EventKind::AllToAllV, 250, 4), 250);
  EXPECT_EQ(bytes_leaving(EventKind::AllReduce, 100, 4), 150);
  EXPECT_EQ(bytes_leaving(EventKind::AllReduce, 100, 3), 133);  // 400/3, rounded down
  EXPECT_EQ(bytes_leaving(EventKind::AllReduce, int64_t(1) << 40, 2), int64_t(1) << 40);
  for (EventKind k : {EventKind::AllGather, EventKind::ReduceScatter, EventKind::AllToAll, EventKind::AllReduce})
    EXPECT_EQ(bytes_leaving(k, 100, 1), 0) << mc::to_string(k) << " on one rank";
  for (EventKind k : {EventKind::Barrier, EventKind::Compute, EventKind::Wait})
    EXPECT_EQ(bytes_leaving(k, 100, 4), 0) << mc::to_string(k);
}

TEST_P(Comm, DisabledTraceRecordsNothing) {
  const mc::Group& g = c_->world();
  trace().clear();
  trace().set_enabled(false);
  const int64_t sent0 = c_->bytes_sent();
  double x = 1;
  c_->allreduce(&x, 1, mc::DType::F64, mc::ReduceOp::Sum, g);
  uint8_t b = 0, rb = 0;
  mc::Request r = c_->isendrecv(&b, 1, (g.rank + 1) % g.size, &rb, 1, (g.rank + g.size - 1) % g.size, g);
  c_->wait(r);
  c_->barrier(g);
  EXPECT_EQ(x, double(g.size));
  EXPECT_TRUE(trace().events().empty());
  const int64_t n = g.size;
  EXPECT_EQ(c_->bytes_sent() - sent0, 2 * (n - 1) * 8 / n + (n > 1 ? 1 : 0)) << "bytes are counted with the trace off";
  trace().set_enabled(true);
  c_->barrier(g);
  EXPECT_EQ(trace().events().size(), 1u);
  EXPECT_EQ(trace().bytes(EventKind::Barrier), 0);
  EXPECT_GE(trace().seconds(EventKind::Barrier), 0.0);
}

// The node topology on one host (where ctest runs it): every rank on node 0, local ranks
// 0..P-1 once each in world-rank order. Skipped, on every rank alike, when the ranks span
// several hosts.
TEST_P(Comm, TopologyOfOneHost) {
  const int P = world_size(), wr = world_rank();
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  std::vector<char> all(size_t(P) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
  for (int r = 0; r < P; ++r)
    if (std::strncmp(all.data() + size_t(r) * MPI_MAX_PROCESSOR_NAME, host, MPI_MAX_PROCESSOR_NAME) != 0)
      GTEST_SKIP() << "ranks on several hosts";
  const mc::Topology& t = c_->topology();
  EXPECT_EQ(t.local_size, P);
  EXPECT_EQ(t.local_rank, wr) << "local ranks follow the world ranks";
  EXPECT_EQ(t.node, 0);
  EXPECT_EQ(t.nodes, 1);
  EXPECT_EQ(t.min_local_size, P);
  EXPECT_EQ(t.hosts, std::vector<std::string>{std::string(host, size_t(len))});
  EXPECT_EQ(t.node_of_rank, std::vector<int>(size_t(P), 0));
  std::vector<int> locals(size_t(P), -1), once(size_t(P), 0);
  MPI_Allgather(&t.local_rank, 1, MPI_INT, locals.data(), 1, MPI_INT, MPI_COMM_WORLD);
  for (int l : locals)
    if (l >= 0 && l < P) ++once[size_t(l)];
  EXPECT_EQ(once, std::vector<int>(size_t(P), 1)) << "every local rank 0..P-1 exactly once";
}

// With host staging MPI receives into a staging buffer: the caller's buffer is written by
// wait(), not before, even when the transfer itself completed long before.
TEST_P(Comm, StagedReceiveLandsInWait) {
  if (GetParam().staging != mc::Staging::Host) GTEST_SKIP() << "direct buffers";
  const mc::Group& g = groups_[0];
  const int n = g.size, next = (g.rank + 1) % n, prev = (g.rank + n - 1) % n;
  const size_t b = size_t(1) << 20;
  std::vector<uint8_t> snd(b), rcv(b + kGuard, kSentinel);
  fill(snd.data(), b, g.rank, 7);
  mc::Request q = c_->isendrecv(snd.data(), b, next, rcv.data(), b, prev, g, 0);
  fill(snd.data(), b, g.rank, 8);  // the send was staged at post: later changes do not travel
  c_->barrier(g);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the progress thread completes it
  size_t untouched = 0;
  for (size_t i = 0; i < b; ++i) untouched += rcv[i] == kSentinel;
  EXPECT_EQ(untouched, b) << "the caller's receive buffer was written before wait()";
  c_->wait(q);
  size_t first = 0;
  EXPECT_EQ(mismatches(rcv.data(), b, prev, 7, &first), 0u) << "first wrong byte " << first;
  EXPECT_TRUE(guard_intact(rcv.data() + b));
}

INSTANTIATE_TEST_SUITE_P(Progress, Comm,
                         ::testing::Values(CommParam{mc::Progress::None, mc::Staging::Direct},
                                           CommParam{mc::Progress::Thread, mc::Staging::Direct},
                                           CommParam{mc::Progress::Thread, mc::Staging::Host}),
                         param_name);

// group_size: the communicator's world is this rank's group of consecutive world ranks.
TEST(CommGroups, WorldOfConsecutiveRanks) {
  const int P = minicp::test::world_size(), me = minicp::test::world_rank();
  for (int n = 1; n <= P; ++n) {
    if (P % n != 0) continue;
    SCOPED_TRACE("group_size " + std::to_string(n));
    auto c = mc::make_mpi_comm(mc::Progress::None, 50, {}, mc::Staging::Direct, n);
    const mc::Group& w = c->world();
    EXPECT_EQ(w.size, n);
    EXPECT_EQ(w.rank, me % n);
    for (int i = 0; i < n; ++i) EXPECT_EQ(w.world_ranks[size_t(i)], me / n * n + i);
    EXPECT_EQ(c->topology().local_size, n) << "one host: every member is local";
    double x = 1.0;  // sums over the group only
    c->allreduce(&x, 1, mc::DType::F64, mc::ReduceOp::Sum, w);
    EXPECT_EQ(x, double(n));
  }
  EXPECT_THROW(mc::make_mpi_comm(mc::Progress::None, 50, {}, mc::Staging::Direct, -1), std::invalid_argument);
}

// A mesh's groups over real ranks: narrow_world makes the CP group (strided over TP's in
// Megatron's order) the world and split_job makes the TP group and the CP x DP group out of
// the job, whose members lie outside that world. Each group's sum of job ranks says who is in
// it. Then the same inside a job of the first half of the ranks (group_size), while the other
// half runs its own: the splits are collective over a job, not over MPI_COMM_WORLD.
void check_mesh_groups(int job_size, const std::string& what) {
  const int me = minicp::test::world_rank(), base = me / job_size * job_size, jr = me - base;
  int checked = 0;
  for (int tp = 1; tp <= job_size; ++tp)
    for (int cp = 1; tp * cp <= job_size; ++cp) {
      if (job_size % (tp * cp) != 0) continue;
      const mc::Mesh mesh(tp, cp, job_size / (tp * cp));
      SCOPED_TRACE(what + " mesh T" + std::to_string(tp) + "C" + std::to_string(cp) + "D" + std::to_string(mesh.dp()));
      auto c = mc::make_mpi_comm(mc::Progress::None, 50, {}, mc::Staging::Direct, job_size);
      c->narrow_world(mesh.color(jr, mc::Axis::CP));
      auto in_world = [&](std::vector<int> job_ranks) {  // MPI_COMM_WORLD ranks of job ranks
        for (int& r : job_ranks) r += base;
        return job_ranks;
      };
      EXPECT_EQ(c->job().size, job_size);
      EXPECT_EQ(c->world().world_ranks, in_world(mesh.group(jr, mc::Axis::CP)));
      EXPECT_EQ(c->world().rank, mesh.coord(jr, mc::Axis::CP));
      EXPECT_EQ(c->topology().local_size, cp) << "one host: every member of the new world is local";
      const mc::Group tpg = c->split_job(mesh.color(jr, mc::Axis::TP), "tp");
      const mc::Group grad = c->split_job(mesh.grad_color(jr), "grad");
      EXPECT_EQ(tpg.world_ranks, in_world(mesh.group(jr, mc::Axis::TP)));
      EXPECT_EQ(grad.world_ranks, in_world(mesh.grad_group(jr)));
      auto sum_of_ranks = [&](const mc::Group& g) {
        double x = jr;
        c->allreduce(&x, 1, mc::DType::F64, mc::ReduceOp::Sum, g);
        return x;
      };
      auto expected = [](const std::vector<int>& members) {
        double s = 0;
        for (int r : members) s += r;
        return s;
      };
      EXPECT_EQ(sum_of_ranks(c->world()), expected(mesh.group(jr, mc::Axis::CP)));
      EXPECT_EQ(sum_of_ranks(tpg), expected(mesh.group(jr, mc::Axis::TP)));
      EXPECT_EQ(sum_of_ranks(grad), expected(mesh.grad_group(jr)));
      ++checked;
    }
  EXPECT_GE(checked, 1);
}

TEST(CommGroups, MeshGroupsThroughNarrowWorldAndJobSplits) {
  const int P = minicp::test::world_size();
  check_mesh_groups(P, "the whole job");
  if (P % 2 == 0 && P > 2) check_mesh_groups(P / 2, "half the ranks");
  auto c = mc::make_mpi_comm(mc::Progress::None);
  EXPECT_THROW(c->split_job(-1, "tp"), std::invalid_argument);
}

TEST(CommParse, ProgressNames) {
  EXPECT_EQ(mc::parse_progress("none"), mc::Progress::None);
  EXPECT_EQ(mc::parse_progress("thread"), mc::Progress::Thread);
  try {
    mc::parse_progress("x");
    ADD_FAILURE() << "no exception for 'x'";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("none, thread"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'x'"), std::string::npos) << msg;
  }
}

TEST(CommParse, StagingNamesAndCpuLists) {
  EXPECT_EQ(mc::parse_staging("direct"), mc::Staging::Direct);
  EXPECT_EQ(mc::parse_staging("host"), mc::Staging::Host);
  EXPECT_THROW(mc::parse_staging("device"), std::invalid_argument);
  EXPECT_EQ(mc::parse_cpu_list("", "--x"), std::vector<int>{});
  EXPECT_EQ(mc::parse_cpu_list("0", "--x"), std::vector<int>{0});
  for (const char* bad : {"a", "0,", "-1", "0,,0", "99999"}) {
    try {
      mc::parse_cpu_list(bad, "--progress-cpus");
      ADD_FAILURE() << "no exception for '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("--progress-cpus '" + std::string(bad) + "'"), std::string::npos)
          << e.what();
    }
  }
}

TEST(CommParse, DTypeSizes) {
  EXPECT_EQ(mc::dtype_size(mc::DType::F32), 4u);
  EXPECT_EQ(mc::dtype_size(mc::DType::F64), 8u);
  EXPECT_EQ(mc::dtype_size(mc::DType::BF16), 2u);
  EXPECT_EQ(mc::dtype_size(mc::DType::I64), 8u);
}

}  // namespace
