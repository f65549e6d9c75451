// harness/memtrack: the in-process Kokkos memory tracker against Views of known size, and the
// RSS readers. Kokkos 3.4 reports a View's span in bytes rounded up to a multiple of 8 (its
// allocation header is not counted): exact for the sizes here but one (7 MiB + 3 B counts
// 7 MiB + 8 B). The tolerance is 1 KiB per allocation, in case a Kokkos version counts a
// header or rounds further.
// Usage: minicp-test-memtrack [gtest flags] (one rank)
#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>

#include "harness/memtrack.hpp"

namespace {
using minicp::harness::MemTracker;
namespace kt = Kokkos::Tools::Experimental;

constexpr int64_t KiB = 1024, MiB = 1024 * KiB;
constexpr int64_t kSlack = 1 * KiB;  // per allocation

// Each test runs with the tracker started (from zero) and stops it at the end.
class MemTrack : public ::testing::Test {
 protected:
  void SetUp() override { mt().start(); }
  void TearDown() override { mt().stop(); }
  static MemTracker& mt() { return MemTracker::instance(); }
};

template <class Space>
Kokkos::View<char*, Space> bytes_view(const std::string& label, int64_t n, bool init = true) {
  if (init) return Kokkos::View<char*, Space>(label, size_t(n));
  return Kokkos::View<char*, Space>(Kokkos::view_alloc(label, Kokkos::WithoutInitializing), size_t(n));
}

TEST_F(MemTrack, TenMiBViewRaisesPeakByTenMiB) {
  const int64_t cur0 = mt().current_bytes(), peak0 = mt().peak_bytes();
  EXPECT_EQ(cur0, 0);  // start() counts from zero
  EXPECT_EQ(peak0, 0);
  {
    Kokkos::View<float*, Kokkos::HostSpace> v("memtrack::ten", size_t(10 * MiB / 4));
    EXPECT_NEAR(double(mt().current_bytes() - cur0), double(10 * MiB), double(kSlack));
    EXPECT_NEAR(double(mt().peak_bytes() - peak0), double(10 * MiB), double(kSlack));
    EXPECT_EQ(mt().allocations(), 1);
  }
  // Freed: current back where it was, the peak stays.
  EXPECT_EQ(mt().current_bytes(), cur0);
  EXPECT_NEAR(double(mt().peak_bytes() - peak0), double(10 * MiB), double(kSlack));
}

TEST_F(MemTrack, TwoViewsAddAndFreeInAnyOrder) {
  auto a = bytes_view<Kokkos::HostSpace>("memtrack::a", 3 * MiB);
  auto b = bytes_view<Kokkos::HostSpace>("memtrack::b", 5 * MiB);
  EXPECT_NEAR(double(mt().current_bytes()), double(8 * MiB), double(2 * kSlack));
  a = {};
  EXPECT_NEAR(double(mt().current_bytes()), double(5 * MiB), double(kSlack));
  auto c = bytes_view<Kokkos::HostSpace>("memtrack::c", 1 * MiB);  // below the peak: it stays
  EXPECT_NEAR(double(mt().peak_bytes()), double(8 * MiB), double(2 * kSlack));
  b = {};
  c = {};
  EXPECT_EQ(mt().current_bytes(), 0);
  // A copy shares the allocation: counted once.
  auto d = bytes_view<Kokkos::HostSpace>("memtrack::d", 2 * MiB);
  auto d2 = d;
  EXPECT_NEAR(double(mt().current_bytes()), double(2 * MiB), double(kSlack));
}

TEST_F(MemTrack, ResetPeakMeasuresFromTheReset) {
  auto keep = bytes_view<Kokkos::HostSpace>("memtrack::keep", 4 * MiB);
  { auto tmp = bytes_view<Kokkos::HostSpace>("memtrack::tmp", 16 * MiB); }
  EXPECT_NEAR(double(mt().peak_bytes()), double(20 * MiB), double(2 * kSlack));
  mt().reset_peak();
  EXPECT_EQ(mt().peak_bytes(), mt().current_bytes());
  EXPECT_EQ(mt().peak_bytes("Host"), mt().current_bytes("Host"));
  const int64_t base = mt().current_bytes();
  { auto tmp = bytes_view<Kokkos::HostSpace>("memtrack::tmp2", 6 * MiB); }
  EXPECT_NEAR(double(mt().peak_bytes() - base), double(6 * MiB), double(kSlack));
  EXPECT_EQ(mt().current_bytes(), base);
}

TEST_F(MemTrack, WithoutInitializingCountsTheSame) {
  int64_t with = 0, without = 0;
  {
    auto v = bytes_view<Kokkos::HostSpace>("memtrack::init", 7 * MiB + 3, true);
    with = mt().current_bytes();
  }
  {
    auto v = bytes_view<Kokkos::HostSpace>("memtrack::noinit", 7 * MiB + 3, false);
    without = mt().current_bytes();
  }
  EXPECT_EQ(with, without);
  EXPECT_NEAR(double(with), double(7 * MiB + 3), double(kSlack));
  EXPECT_EQ(mt().current_bytes(), 0);
}

// Counted per space by SpaceHandle name, and in total. The OpenMP build has one memory
// space (HostSpace, "Host"), so the default execution space's is the same one there; a
// device build counts its space separately.
TEST_F(MemTrack, PerSpaceAndTotal) {
  using Dev = Kokkos::DefaultExecutionSpace::memory_space;
  const std::string host = Kokkos::HostSpace::name(), dev = Dev::name();
  auto h = bytes_view<Kokkos::HostSpace>("memtrack::host", 2 * MiB);
  auto d = bytes_view<Dev>("memtrack::dev", 3 * MiB);
  EXPECT_NEAR(double(mt().current_bytes()), double(5 * MiB), double(2 * kSlack));
  if (host == dev) {
    EXPECT_NEAR(double(mt().current_bytes(host)), double(5 * MiB), double(2 * kSlack));
  } else {
    EXPECT_NEAR(double(mt().current_bytes(host)), double(2 * MiB), double(kSlack));
    EXPECT_NEAR(double(mt().current_bytes(dev)), double(3 * MiB), double(kSlack));
  }
  int64_t sum = 0;
  for (const std::string& s : mt().spaces()) sum += mt().current_bytes(s);
  EXPECT_EQ(sum, mt().current_bytes());
  EXPECT_EQ(mt().current_bytes("NoSuchSpace"), 0);
  h = {};
  d = {};
  EXPECT_EQ(mt().current_bytes(host), 0);
  EXPECT_NEAR(double(mt().peak_bytes(dev)), double(host == dev ? 5 * MiB : 3 * MiB), double(2 * kSlack));
}

TEST_F(MemTrack, LiveAllocationsByLabel) {
  auto a = bytes_view<Kokkos::HostSpace>("memtrack::big", 2 * MiB);
  auto b = bytes_view<Kokkos::HostSpace>("memtrack::small", 1 * MiB);
  const auto live = mt().live();
  ASSERT_GE(live.size(), 2u);
  EXPECT_EQ(live[0].label, "memtrack::big");  // largest first
  EXPECT_EQ(live[0].space, "Host");
  EXPECT_EQ(live[1].label, "memtrack::small");
  mt().record_peak_set(true);
  { auto t = bytes_view<Kokkos::HostSpace>("memtrack::transient", 4 * MiB); }
  const auto at_peak = mt().live_at_peak();
  mt().record_peak_set(false);
  ASSERT_FALSE(at_peak.empty());
  EXPECT_EQ(at_peak[0].label, "memtrack::transient");
}

// A View made before start() and freed after it changes nothing (its bytes were never
// counted); allocations after stop() are not counted.
TEST(MemTrackScope, BeforeStartAndAfterStop) {
  MemTracker& mt = MemTracker::instance();
  auto old = bytes_view<Kokkos::HostSpace>("memtrack::old", 2 * MiB);
  mt.start();
  old = {};
  EXPECT_EQ(mt.current_bytes(), 0);
  EXPECT_EQ(mt.peak_bytes(), 0);
  mt.stop();
  EXPECT_FALSE(mt.running());
  { auto after = bytes_view<Kokkos::HostSpace>("memtrack::after", 2 * MiB); }
  EXPECT_EQ(mt.peak_bytes(), 0);
  mt.stop();  // a second stop is harmless
}

// The callbacks in place at start() (a loaded Kokkos Tools library's) still see every event
// while the tracker runs, and are back after stop().
int g_tool_allocs = 0, g_tool_frees = 0;
void tool_alloc(const Kokkos::Tools::SpaceHandle, const char*, const void*, const uint64_t) { ++g_tool_allocs; }
void tool_free(const Kokkos::Tools::SpaceHandle, const char*, const void*, const uint64_t) { ++g_tool_frees; }

TEST(MemTrackScope, ChainsToTheCallbacksInPlace) {
  const kt::EventSet before = kt::get_callbacks();
  kt::set_allocate_data_callback(&tool_alloc);
  kt::set_deallocate_data_callback(&tool_free);
  MemTracker& mt = MemTracker::instance();
  mt.start();
  g_tool_allocs = g_tool_frees = 0;
  { auto v = bytes_view<Kokkos::HostSpace>("memtrack::chained", 1 * MiB); }
  EXPECT_EQ(g_tool_allocs, 1);
  EXPECT_EQ(g_tool_frees, 1);
  EXPECT_NEAR(double(mt.peak_bytes()), double(1 * MiB), double(kSlack));
  mt.stop();
  EXPECT_EQ(kt::get_callbacks().allocate_data, &tool_alloc);
  EXPECT_EQ(kt::get_callbacks().deallocate_data, &tool_free);
  kt::set_allocate_data_callback(before.allocate_data);
  kt::set_deallocate_data_callback(before.deallocate_data);
}

// VmRSS grows by the pages a View touches, and VmHWM is at least the tracked peak.
TEST_F(MemTrack, PeakRssCoversTheTrackedPeak) {
  const int64_t rss0 = minicp::harness::current_rss_bytes();
  ASSERT_GT(rss0, 0);
  ASSERT_GT(minicp::harness::peak_rss_bytes(), 0);
  const int64_t n = 64 * MiB;
  auto v = bytes_view<Kokkos::HostSpace>("memtrack::touched", n, false);
  Kokkos::deep_copy(v, char(1));  // every page written
  Kokkos::fence();
  const int64_t rss1 = minicp::harness::current_rss_bytes(), hwm = minicp::harness::peak_rss_bytes();
  EXPECT_GE(rss1 - rss0, n * 95 / 100) << "VmRSS " << rss0 << " -> " << rss1;
  EXPECT_GE(hwm, rss1);
  EXPECT_GE(hwm, mt().peak_bytes());
  EXPECT_GE(mt().peak_bytes(), n);
}

}  // namespace
