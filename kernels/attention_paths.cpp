// The bf16 attention paths measured against each other (attention.hpp: measure_attention_paths,
// fastest_attention_path, set_attention_isa). Which path is fastest depends on the CPU: on
// one Intel host with AMX the AVX512-BF16 dot products ran slower than the plain path, on
// AMD Zen 5 1.5x faster. So a run times each on its own head_dim rather than trust the flags.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/attention_impl.hpp"
#include "kernels/convert.hpp"

namespace minicp::kernels {

namespace {
std::string g_choice;  // set_attention_isa's; "" while none is set

#ifdef MINICP_HOST_TILES
// A causal bf16 problem of S tokens, H heads of D on every thread's share (values in [-1, 1)).
struct PathProblem {
  View3<bf16> q, k, v, o16, dout;
  View3<float> o, dq, dk, dv;
  View2<float> lse;
  Kokkos::View<int64_t*, Mem> pos;
  AttnMask mask;
  PathProblem(int S, int H, int D)
      : q("paths::q", S, H, D),
        k("paths::k", S, H, D),
        v("paths::v", S, H, D),
        o16("paths::o16", S, H, D),
        dout("paths::do", S, H, D),
        o("paths::o", S, H, D),
        dq("paths::dq", S, H, D),
        dk("paths::dk", S, H, D),
        dv("paths::dv", S, H, D),
        lse("paths::lse", S, H),
        pos("paths::pos", S) {
    uint32_t x = 12345;
    for (View3<bf16> t : {q, k, v, dout}) {
      bf16* p = t.data();
      for (size_t i = 0; i < t.span(); ++i) {
        x = x * 1664525u + 1013904223u;
        p[i] = bf16(float(x >> 8) / float(1u << 23) - 1.0f);
      }
    }
    for (int i = 0; i < S; ++i) pos(i) = i;
    mask.q_pos = pos, mask.k_pos = pos;
  }
  AttnStats forward() { return attention_fwd<bf16>(q, k, v, mask, o, lse); }
  AttnStats backward() { return attention_bwd<bf16>(q, k, v, o16, lse, dout, mask, dq, dk, dv); }
};

// The path attention_isa() returns while it lives (the choice set aside, restored after).
class PathScope {
 public:
  explicit PathScope(const std::string& isa) : saved_(g_choice) { g_choice = isa; }
  ~PathScope() { g_choice = saved_; }
  PathScope(const PathScope&) = delete;
  PathScope& operator=(const PathScope&) = delete;

 private:
  std::string saved_;
};

// FLOP/s of call() repeated for at least min_s after one untimed call.
template <class F>
double rate(F&& call, double min_s) {
  using Clock = std::chrono::steady_clock;
  call();
  Kokkos::fence();
  double flops = 0, t = 0;
  const Clock::time_point t0 = Clock::now();
  do {
    flops += call().flops;
    Kokkos::fence();
    t = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (t < min_s);
  return flops / t;
}

// "" when the AMX kernel gives its emulation's results bit for bit on a small ragged
// problem (forward and backward), else what differs.
std::string amx_startup_check(int D) {
  PathProblem p(80, 2, D);
  std::vector<float> got[2];
  for (int i = 0; i < 2; ++i) {
    const PathScope path(i == 0 ? "amx" : "amx-emulated");
    Kokkos::deep_copy(p.dq, 0.0f), Kokkos::deep_copy(p.dk, 0.0f), Kokkos::deep_copy(p.dv, 0.0f);
    p.forward();
    convert_view<bf16, float>(p.o16, p.o);
    p.backward();
    Kokkos::fence();
    for (View3<float> t : {p.o, p.dq, p.dk, p.dv}) got[i].insert(got[i].end(), t.data(), t.data() + t.span());
  }
  size_t differ = 0;
  for (size_t j = 0; j < got[0].size(); ++j) differ += std::memcmp(&got[0][j], &got[1][j], sizeof(float)) != 0;
  return differ == 0 ? ""
                     : "start-up check: " + std::to_string(differ) + " of " + std::to_string(got[0].size()) +
                           " values differ from the emulation";
}
#endif
}  // namespace

namespace detail {
const std::string& attention_isa_choice() { return g_choice; }
}  // namespace detail

void set_attention_isa(const std::string& isa) { g_choice = isa; }

std::vector<AttnPathRate> measure_attention_paths(int head_dim, double min_s) {
  std::vector<AttnPathRate> out;
#ifndef MINICP_HOST_TILES
  (void)head_dim, (void)min_s;  // a device build: its bf16 attention is the team kernel's alone
#else
  const char* forced = std::getenv("MINICP_ATTENTION_ISA");
  if (forced && *forced) return out;  // a forced path is not measured against the others
  const int S = 512, H = std::max(2, 2 * int(HostExec().concurrency()));
  out = attention_paths_here(head_dim);
  PathProblem p(S, H, head_dim);
  p.forward();
  convert_view<bf16, float>(p.o16, p.o);
  for (AttnPathRate& r : out) {
    if (r.isa == "amx" && r.refused.empty()) r.refused = amx_startup_check(head_dim);
    if (!r.refused.empty()) continue;
    const PathScope path(r.isa);
    r.fwd_flops_per_s = rate([&] { return p.forward(); }, min_s);
    r.bwd_flops_per_s = rate([&] { return p.backward(); }, min_s);
  }
#endif
  return out;
}

std::vector<AttnPathRate> attention_paths_here(int head_dim) {
  std::vector<AttnPathRate> out;
#ifdef MINICP_HOST_TILES
  out.push_back({"plain", 0, 0, ""});
  out.push_back({"avx512_bf16", 0, 0,
                 !detail::cpu_has_avx512_bf16() ? "this CPU has no avx512_bf16"
                 : head_dim % 2                 ? "head_dim " + std::to_string(head_dim) + " is odd"
                                                : ""});
  out.push_back({"amx", 0, 0, detail::amx_unusable()});
#else
  (void)head_dim;
#endif
  return out;
}

std::string fastest_attention_path(const std::vector<AttnPathRate>& rates) {
  std::string best = "plain";
  double best_s = -1;
  for (const AttnPathRate& r : rates) {
    if (!r.refused.empty() || r.fwd_flops_per_s <= 0 || r.bwd_flops_per_s <= 0) continue;
    // Seconds per forward FLOP of a training step's attention: the backward does 2.5x the
    // forward's FLOPs (10 against 4 per query, key and head_dim entry).
    const double s = 1 / r.fwd_flops_per_s + 2.5 / r.bwd_flops_per_s;
    if (best_s < 0 || s < best_s) best = r.isa, best_s = s;
  }
  return best;
}

std::string describe_attention_paths(const std::vector<AttnPathRate>& rates) {
  std::string out;
  char b[160];
  for (const AttnPathRate& r : rates) {
    if (!out.empty()) out += "; ";
    if (!r.refused.empty()) {
      out += r.isa + " not run (" + r.refused + ")";
      continue;
    }
    std::snprintf(b, sizeof b, "%s fwd %.1f bwd %.1f GFLOP/s", r.isa.c_str(), r.fwd_flops_per_s / 1e9,
                  r.bwd_flops_per_s / 1e9);
    out += b;
  }
  return out;
}

}  // namespace minicp::kernels
