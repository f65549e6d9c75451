// The memory model of the layer stack (model::predicted_stack_bytes, the number --dry-run and
// the memory checks use) against the bytes Kokkos actually holds (harness::MemTracker): for
// every scheme of the registry that runs at this rank count, the train pass (and decode for
// the schemes that solve it) of a model::Stack in fp32 and in bf16 on the cpu-small shape, one forward and
// one backward. The measured figure is the high-water mark of the Kokkos allocations from the
// stack's construction to the end of its backward, on the rank that holds most; the
// prediction must be within 5% of it for every case. The schemes' scratch buffers
// (cp::scratch, a process-wide cache) are released before each case, so that each case
// allocates, and is charged for, its own.
// Usage: minicp-test-memory-model [gtest flags] (ctest: np 1 and 2)
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "harness/memory.hpp"
#include "harness/memtrack.hpp"
#include "miniapp/cp/common.hpp"
#include "miniapp/model/layer.hpp"
#include "tests/mpi_util.hpp"

namespace {
using namespace minicp;

constexpr double kTolerance = 0.05;  // |predicted - measured| / measured

struct Case {
  std::string dtype;
  std::string scheme;
  model::Pass pass;
  int64_t seq_len;
  int64_t predicted = 0, measured = 0, measured_min = 0;
  double err() const { return double(predicted - measured) / double(measured); }
};

// Rank 0's allocations at its peak, for a case off the mark: the stack's own (labels
// "model::") summed, every other one (the scheme's, the kernels') by label, largest first.
std::string peak_breakdown(const std::vector<harness::MemTracker::Allocation>& at_peak) {
  std::string out;
  int64_t stack = 0;
  size_t shown = 0;
  for (const auto& a : at_peak) {
    if (a.label.rfind("model::", 0) == 0) {
      stack += a.bytes;
    } else if (++shown <= 40) {
      out += "    " + std::to_string(a.bytes) + " B  " + a.label + "\n";
    }
  }
  return out + "    " + std::to_string(stack) + " B  model::* (the stack's own)\n";
}

template <class T>
Case measure(const cp::SchemeInfo& info, model::Pass pass, int64_t seq_len, comm::Communicator& comm,
             std::string& breakdown) {
  model::StackConfig cfg;
  cfg.shape = *model::find_preset("cpu-small");
  cfg.pass = pass;
  cfg.attn.seq_len = seq_len;
  cfg.attn.ranks = comm.world().size;
  Case c{kernels::dtype_name<T>(), info.name, pass, seq_len};
  c.predicted = model::predicted_stack_bytes(cfg, info, sizeof(T));

  harness::MemTracker& mt = harness::MemTracker::instance();
  cp::release_scratch();
  const int64_t base = mt.current_bytes();
  mt.reset_peak();
  {
    model::Stack<T> st(cfg, info, comm);
    cp::Context ctx{comm, model::attention_config(cfg)};
    st.forward(ctx);
    if (pass == model::Pass::Train) st.backward(ctx);
    Kokkos::fence();
  }
  cp::release_scratch();
  int64_t grew = mt.peak_bytes() - base, most = grew, least = grew;
  MPI_Allreduce(&grew, &most, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(&grew, &least, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
  c.measured = most;
  c.measured_min = least;
  // Everything the case allocated is freed with it (nothing leaks into the next case).
  EXPECT_EQ(mt.current_bytes(), base) << info.name << " " << model::to_string(pass) << " S=" << seq_len;
  breakdown = peak_breakdown(mt.live_at_peak());
  return c;
}

TEST(MemoryModel, PredictionWithinFivePercentOfKokkosPeak) {
  harness::MemTracker& mt = harness::MemTracker::instance();
  mt.start();
  mt.record_peak_set(true);
  const int P = test::world_size(), rank = test::world_rank();
  auto comm = comm::make_mpi_comm(comm::Progress::None);
  std::vector<Case> cases;
  for (const cp::SchemeInfo& info : cp::registry()) {
    for (model::Pass pass : {model::Pass::Train, model::Pass::Decode}) {
      const cp::Problem problem = pass == model::Pass::Decode ? cp::Problem::Decode : cp::Problem::Train;
      if (!info.solves(problem)) continue;
      for (int64_t S : {256, 512}) {  // two lengths: the model must scale with S, not fit one point
        model::StackConfig cfg;
        cfg.shape = *model::find_preset("cpu-small");
        cfg.pass = pass;
        cfg.attn.seq_len = S;
        cfg.attn.ranks = P;
        if (!cp::check(info, model::attention_config(cfg)).empty()) continue;
        for (const bool bf16 : {false, true}) {
          std::string breakdown;
          const Case c = bf16 ? measure<kernels::bf16>(info, pass, S, *comm, breakdown)
                              : measure<float>(info, pass, S, *comm, breakdown);
          cases.push_back(c);
          EXPECT_LE(std::abs(c.err()), kTolerance)
              << c.dtype << " " << c.scheme << " " << model::to_string(pass) << " S=" << S << " P=" << P
              << ": predicted " << c.predicted << " B, measured " << c.measured << " B (" << 100 * c.err()
              << "%); at the peak:\n"
              << (rank == 0 ? breakdown : std::string());
        }
      }
    }
  }
  mt.record_peak_set(false);
  mt.stop();
  EXPECT_FALSE(cases.empty());
  if (rank == 0) {
    std::printf("memory model, cpu-small, P=%d: predicted vs Kokkos peak (rank that holds most)\n", P);
    std::printf("  %-5s %-11s %-7s %6s %14s %14s %8s\n", "dtype", "scheme", "pass", "S", "predicted MiB",
                "measured MiB", "error");
    const double MiB = 1024.0 * 1024.0;
    for (const Case& c : cases)
      std::printf("  %-5s %-11s %-7s %6lld %14.2f %14.2f %+7.2f%%\n", c.dtype.c_str(), c.scheme.c_str(),
                  model::to_string(c.pass), (long long)c.seq_len, double(c.predicted) / MiB, double(c.measured) / MiB,
                  100 * c.err());
    std::fflush(stdout);
  }
}

}  // namespace
