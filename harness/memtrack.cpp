// The in-process Kokkos memory tracker and the RSS readers (see memtrack.hpp).
#include "harness/memtrack.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace minicp::harness {

namespace kt = Kokkos::Tools::Experimental;

namespace {
struct Counter {
  int64_t current = 0, peak = 0;
  void add(int64_t b) {
    current += b;
    peak = std::max(peak, current);
  }
};
}  // namespace

struct MemTracker::State {
  mutable std::mutex mu;
  bool running = false;
  // The callbacks in place at start(): every event is handed on to them, and stop() puts
  // them back.
  Kokkos::Tools::allocateDataFunction prev_alloc = nullptr;
  Kokkos::Tools::deallocateDataFunction prev_dealloc = nullptr;
  Counter total;
  std::map<std::string, Counter> by_space;
  struct Live {
    std::string space, label;
    int64_t bytes = 0;
  };
  // Live allocations by address: a deallocation is counted only when its allocation was
  // (Views made before start() are freed without changing the counts).
  std::unordered_map<const void*, Live> live;
  int64_t allocations = 0;
  bool record_peak = false;
  std::vector<Allocation> at_peak;

  std::vector<Allocation> snapshot() const {
    std::vector<Allocation> out;
    out.reserve(live.size());
    for (const auto& [p, l] : live) out.push_back({l.space, l.label, l.bytes});
    std::sort(out.begin(), out.end(), [](const Allocation& a, const Allocation& b) {
      return a.bytes != b.bytes ? a.bytes > b.bytes : a.label < b.label;
    });
    return out;
  }
};

// The C callbacks Kokkos calls; they reach the tracker through instance().
struct MemTrackerCallbacks {
  static void on_allocate(const Kokkos::Tools::SpaceHandle h, const char* label, const void* ptr, const uint64_t size) {
    MemTracker::State& s = *MemTracker::instance().s_;
    Kokkos::Tools::allocateDataFunction prev = nullptr;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      prev = s.prev_alloc;
      const int64_t b = int64_t(size);
      auto [it, fresh] = s.live.emplace(ptr, MemTracker::State::Live{h.name, label ? label : "", b});
      if (!fresh) {  // an address freed unseen (never: Kokkos reports every free); count it anew
        s.total.add(-it->second.bytes);
        s.by_space[it->second.space].add(-it->second.bytes);
        it->second = MemTracker::State::Live{h.name, label ? label : "", b};
      }
      const int64_t old_peak = s.total.peak;
      s.total.add(b);
      s.by_space[h.name].add(b);
      ++s.allocations;
      if (s.record_peak && s.total.peak > old_peak) s.at_peak = s.snapshot();
    }
    if (prev) prev(h, label, ptr, size);
  }

  static void on_deallocate(const Kokkos::Tools::SpaceHandle h, const char* label, const void* ptr,
                            const uint64_t size) {
    MemTracker::State& s = *MemTracker::instance().s_;
    Kokkos::Tools::deallocateDataFunction prev = nullptr;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      prev = s.prev_dealloc;
      auto it = s.live.find(ptr);
      if (it != s.live.end()) {  // the bytes counted at allocation (Kokkos reports the same size)
        s.total.add(-it->second.bytes);
        s.by_space[it->second.space].add(-it->second.bytes);
        s.live.erase(it);
      }
    }
    if (prev) prev(h, label, ptr, size);
  }
};

MemTracker::MemTracker() : s_(std::make_unique<State>()) {}
MemTracker::~MemTracker() = default;

MemTracker& MemTracker::instance() {
  // Never destroyed: Kokkos may report frees (finalize hooks, static Views) after main returns.
  static MemTracker* t = new MemTracker();
  return *t;
}

void MemTracker::start() {
  if (!Kokkos::is_initialized())
    throw std::logic_error("MemTracker::start: call it after Kokkos::initialize (and before Kokkos::finalize)");
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->total = Counter{};
  s_->by_space.clear();
  s_->live.clear();
  s_->allocations = 0;
  s_->at_peak.clear();
  if (s_->running) return;
  const kt::EventSet in_place = kt::get_callbacks();
  s_->prev_alloc = in_place.allocate_data;
  s_->prev_dealloc = in_place.deallocate_data;
  kt::set_allocate_data_callback(&MemTrackerCallbacks::on_allocate);
  kt::set_deallocate_data_callback(&MemTrackerCallbacks::on_deallocate);
  s_->running = true;
}

void MemTracker::stop() {
  std::lock_guard<std::mutex> lock(s_->mu);
  if (!s_->running) return;
  const kt::EventSet in_place = kt::get_callbacks();
  // Put back what was there, unless someone registered other callbacks since (theirs stay).
  if (in_place.allocate_data == &MemTrackerCallbacks::on_allocate) kt::set_allocate_data_callback(s_->prev_alloc);
  if (in_place.deallocate_data == &MemTrackerCallbacks::on_deallocate)
    kt::set_deallocate_data_callback(s_->prev_dealloc);
  s_->prev_alloc = nullptr;
  s_->prev_dealloc = nullptr;
  s_->running = false;
}

bool MemTracker::running() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->running;
}

void MemTracker::reset_peak() {
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->total.peak = s_->total.current;
  for (auto& [name, c] : s_->by_space) c.peak = c.current;
  if (s_->record_peak) s_->at_peak = s_->snapshot();
}

int64_t MemTracker::current_bytes() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->total.current;
}

int64_t MemTracker::peak_bytes() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->total.peak;
}

int64_t MemTracker::current_bytes(const std::string& space) const {
  std::lock_guard<std::mutex> lock(s_->mu);
  const auto it = s_->by_space.find(space);
  return it == s_->by_space.end() ? 0 : it->second.current;
}

int64_t MemTracker::peak_bytes(const std::string& space) const {
  std::lock_guard<std::mutex> lock(s_->mu);
  const auto it = s_->by_space.find(space);
  return it == s_->by_space.end() ? 0 : it->second.peak;
}

std::vector<std::string> MemTracker::spaces() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  std::vector<std::string> out;
  for (const auto& [name, c] : s_->by_space) out.push_back(name);
  return out;
}

int64_t MemTracker::allocations() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->allocations;
}

std::vector<MemTracker::Allocation> MemTracker::live() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->snapshot();
}

void MemTracker::record_peak_set(bool record) {
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->record_peak = record;
  s_->at_peak = record ? s_->snapshot() : std::vector<Allocation>{};
}

std::vector<MemTracker::Allocation> MemTracker::live_at_peak() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->at_peak;
}

namespace {
// The "<key>: <n> kB" line of /proc/self/status, in bytes; -1 when absent or unreadable.
int64_t proc_status_bytes(const char* key) {
  std::ifstream f("/proc/self/status");
  if (!f) return -1;
  const size_t klen = std::strlen(key);
  std::string line;
  while (std::getline(f, line)) {
    if (line.compare(0, klen, key) != 0 || line.size() <= klen || line[klen] != ':') continue;
    long long kb = -1;
    char unit[8] = {0};
    if (std::sscanf(line.c_str() + klen + 1, "%lld %7s", &kb, unit) != 2 || kb < 0 || std::strcmp(unit, "kB") != 0)
      return -1;
    return int64_t(kb) * 1024;
  }
  return -1;
}
}  // namespace

int64_t peak_rss_bytes() { return proc_status_bytes("VmHWM"); }
int64_t current_rss_bytes() { return proc_status_bytes("VmRSS"); }

}  // namespace minicp::harness
