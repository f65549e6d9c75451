// In-process memory high-water marks: the bytes Kokkos holds (counted by Kokkos Tools
// allocate / deallocate callbacks registered in this process, per memory space and in total)
// and the resident set of the process (VmRSS / VmHWM of /proc/self/status).
//
// Use (after Kokkos::initialize):
//   auto& mt = minicp::harness::MemTracker::instance();
//   mt.start();                 // counts from zero: allocations made before are not seen
//   mt.reset_peak();            // the case starts here: peak = current
//   ... run the case ...
//   int64_t grew = mt.peak_bytes() - bytes_at_reset;
//   mt.stop();                  // the callbacks that were there before are back
//
// Bytes are the sizes Kokkos reports to the tools: the View's span in bytes (the logical
// size, rounded up to a multiple of 8 in 3.4), without the allocation record's header
// (128 B in 3.4) or the allocator's own rounding. Host spaces only here (the OpenMP build has HostSpace); a
// device build also reports "Cuda", "CudaUVM", ... by their SpaceHandle names.
//
// A Kokkos Tools library loaded through KOKKOS_PROFILE_LIBRARY or --kokkos-tools-library:
// Kokkos keeps one callback per event (Kokkos::Tools::Experimental::set_allocate_data_callback
// replaces the one in its event set, which holds the tool's kokkosp_allocate_data after
// Kokkos::initialize). start() therefore reads the callbacks in place
// (Kokkos::Tools::Experimental::get_callbacks) and every event it sees is handed on to them
// unchanged, so the tool still sees every allocation while the tracker runs; stop() puts them
// back. Kokkos::Tools::Experimental::pause_tools() silences the tracker too (the tracker is
// part of the event set it swaps out). start() must come after Kokkos::initialize: the tool
// library is loaded there and would replace the tracker's callbacks.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace minicp::harness {

class MemTracker {
 public:
  // The process-wide tracker (Kokkos Tools callbacks are process-wide).
  static MemTracker& instance();

  // Registers the allocate / deallocate callbacks (chained to the ones in place) and zeroes
  // every count. Throws std::logic_error before Kokkos::initialize or after Kokkos::finalize.
  // A second start() while running only zeroes the counts.
  void start();
  // Restores the callbacks that were in place at start() (when the tracker's are still the
  // ones registered). Safe before Kokkos::finalize, and when not running. The counts stay
  // readable, frozen.
  void stop();
  bool running() const;

  // Peak := current, in total and for every space: a case's peak is then its high-water mark
  // from this point on (peak_bytes() - current_bytes() at the reset = what it added).
  void reset_peak();

  // Bytes of the allocations made since start() and not yet freed; the most of them at any
  // time since start() or the last reset_peak(). Per space: by SpaceHandle name ("Host");
  // 0 for a space never seen.
  int64_t current_bytes() const;
  int64_t peak_bytes() const;
  int64_t current_bytes(const std::string& space) const;
  int64_t peak_bytes(const std::string& space) const;
  // Names of the spaces seen since start().
  std::vector<std::string> spaces() const;
  // Allocations counted since start() (deallocations of allocations made before start()
  // are not counted and change nothing).
  int64_t allocations() const;

  // One live allocation: its space, label (the View's) and bytes.
  struct Allocation {
    std::string space, label;
    int64_t bytes = 0;
  };
  // The allocations live now, largest first.
  std::vector<Allocation> live() const;
  // With record on, the tracker keeps a copy of the live allocations each time the total
  // peak rises (cost: one copy of the live set per new peak), readable by live_at_peak();
  // reset_peak() sets it to the live set at the reset. Off by default.
  void record_peak_set(bool record);
  std::vector<Allocation> live_at_peak() const;

  MemTracker(const MemTracker&) = delete;
  MemTracker& operator=(const MemTracker&) = delete;
  ~MemTracker();

 private:
  MemTracker();
  struct State;
  std::unique_ptr<State> s_;
  friend struct MemTrackerCallbacks;
};

// Peak resident set of this process (VmHWM of /proc/self/status), in bytes; -1 when it cannot
// be read. It never goes down: it counts from the start of the process (or the last write of
// "5" to /proc/self/clear_refs, which resets it on Linux >= 4.0).
int64_t peak_rss_bytes();
// Resident set now (VmRSS), in bytes; -1 when it cannot be read.
int64_t current_rss_bytes();

}  // namespace minicp::harness
