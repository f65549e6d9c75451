// Google Benchmark timings of the miniCP kernels: BLAS GEMM, the bf16 GEMM engine, attention
// forward and backward on one rank in fp32 and in bf16 (BM_Attention*Bf16: the path
// attention_isa() names; *Bf16Plain: the plain path; *Bf16AmxNoTiles: the AMX engine without its
// tile instructions, a bound). FLOPS counters report useful FLOP/s;
// exec_FLOPS the executed ones.
// Its own flags are checked (harness/, no MPI) before Kokkos starts or anything is allocated.
// Run: minicp-kernels-bench --benchmark_filter='BM_(Sgemm|AttentionFwd|AttentionBwd)'
// bf16 against fp32, alternated: --benchmark_filter='BM_(Sgemm|Bf16Gemm)/2048'
//   --benchmark_repetitions=6 --benchmark_enable_random_interleaving=true
// bf16 attention on both paths against fp32, alternated the same way:
//   --benchmark_filter='BM_(Bf16Gemm/2048|Attention(Fwd|Bwd)(Bf16|Bf16Plain)?/4096/128/1/)'
#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "harness/blas.hpp"
#include "harness/cli.hpp"
#include "harness/main.hpp"
#include "harness/memory.hpp"
#include "harness/output.hpp"
#include "kernels/attention.hpp"
#include "kernels/attention_impl.hpp"
#include "kernels/ceiling.hpp"
#include "kernels/convert.hpp"
#include "kernels/gemm.hpp"
#include "kernels/types.hpp"

namespace {

namespace kk = minicp::kernels;

// Deterministic pseudo-random value in [-1, 1] from (seed, index): splitmix64 finaliser.
float hash_unit(uint64_t seed, uint64_t i) {
  uint64_t z = i + seed * 0x9E3779B97F4A7C15ull + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

// Fills a device View with hash_unit(seed, flat index) through a host mirror.
template <class V>
void fill_random(const V& v, uint64_t seed) {
  auto h = Kokkos::create_mirror_view(v);
  auto* p = h.data();
  const size_t n = h.span();
  for (size_t i = 0; i < n; ++i) p[i] = hash_unit(seed, i);
  Kokkos::deep_copy(v, h);
}

// Global positions 0..S-1.
Kokkos::View<const int64_t*, kk::Mem> iota_positions(int64_t S) {
  Kokkos::View<int64_t*, kk::Mem> pos("pos", S);
  auto h = Kokkos::create_mirror_view(pos);
  for (int64_t i = 0; i < S; ++i) h(i) = i;
  Kokkos::deep_copy(pos, h);
  return pos;
}

// Heads of every attention benchmark; --heads=N changes both (kv_heads = heads).
int kHeads = 8;
int kKvHeads = 8;

// gemm<T> n^3: BM_Sgemm the fp32 BLAS, BM_Bf16Gemm the bf16 engine (gemm_bf16_engine in
// the context: oneDNN's matmul, or convert+sgemm).
template <class T>
void BM_Gemm(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  kk::View2<T> A("A", n, n), B("B", n, n), C("C", n, n);
  fill_random(A, 1);
  fill_random(B, 2);
  Kokkos::deep_copy(C, T(0.0f));
  Kokkos::fence();
  for (auto _ : state) {
    kk::gemm<T>(kk::Trans::N, kk::Trans::N, 1.0f, A, B, 0.0f, C);
    Kokkos::fence();
    benchmark::DoNotOptimize(C.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOPS"] = benchmark::Counter(kk::gemm_flops(n, n, n), benchmark::Counter::kIsIterationInvariantRate);
}

// The attention tile kernels' own product rate, as the GEMM ceiling measures it (ceiling.hpp:
// 128 x 256 x 128 in-cache products on every thread, best of 3): BM_TileGemm the fp32 tiles
// (the plain bf16 path's too: it widens to fp32), BM_Bf16TileGemm the bf16 tiles of the path
// attention_isa() names (FLOPS 0 where that path has none). FLOPS: the best iteration's.
template <bool Bf16>
void BM_TileGemm(benchmark::State& state) {
  double best = 0;
  for (auto _ : state) best = std::max(best, Bf16 ? kk::bf16_tile_gemm_rate([] {}) : kk::tile_gemm_rate([] {}));
  state.counters["FLOPS"] = best;
}

// Inputs of one attention problem: q[S,H,D], k,v[S,Hkv,D], positions 0..S-1.
template <class T>
struct AttnProblem {
  kk::View3<T> q, k, v;
  kk::AttnMask mask;
  AttnProblem(int64_t S, int64_t D, bool causal)
      : q("q", S, kHeads, D), k("k", S, kKvHeads, D), v("v", S, kKvHeads, D) {
    fill_random(q, 11);
    fill_random(k, 12);
    fill_random(v, 13);
    const auto pos = iota_positions(S);
    mask.q_pos = pos;
    mask.k_pos = pos;
    mask.causal = causal;
    mask.window = 0;
  }
};

// Optional args 4 and 5 (the *Tiles families) set the tiled path's q and k tile sizes.
kk::AttnOptions tile_options(const benchmark::State& state) {
  kk::AttnOptions opt;
  if (state.range(3) > 0) opt.tile_q = int(state.range(3));
  if (state.range(4) > 0) opt.tile_k = int(state.range(4));
  return opt;
}

// The bf16 path of a benchmark: Plain forces the plain one (MINICP_ATTENTION_ISA=plain)
// while it runs, so both paths alternate in one process; AmxNoTiles runs the AMX engine with
// its tile operations as no-ops (detail::attention_*_amx_no_tiles): its work between the tile
// products alone, the rate the amx path cannot pass, on any host.
enum class Isa { Auto, Plain, AmxNoTiles };
class IsaScope {
 public:
  explicit IsaScope(Isa isa) : set_(isa == Isa::Plain) {
    const char* old = std::getenv(kVar);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (set_) setenv(kVar, "plain", 1);
  }
  ~IsaScope() {
    if (!set_) return;
    if (had_)
      setenv(kVar, old_.c_str(), 1);
    else
      unsetenv(kVar);
  }

 private:
  static constexpr const char* kVar = "MINICP_ATTENTION_ISA";
  bool set_, had_ = false;
  std::string old_;
};

// One forward or backward of the benchmark's path.
template <class T, Isa isa>
kk::AttnStats forward(const AttnProblem<T>& p, kk::View3<kk::acc_t<T>> o, kk::View2<kk::acc_t<T>> lse,
                      const kk::AttnOptions& opt) {
  if constexpr (isa == Isa::AmxNoTiles)
    return kk::detail::attention_fwd_amx_no_tiles(
        p.q, p.k, p.v, p.mask, o, lse, kk::detail::resolve_scale<float>(opt, p.q.extent(2)), opt.tile_q, opt.tile_k);
  else
    return kk::attention_fwd<T>(p.q, p.k, p.v, p.mask, o, lse, opt);
}
template <class T, Isa isa, class A = kk::acc_t<T>>
kk::AttnStats backward(const AttnProblem<T>& p, kk::View3<T> o, kk::View2<A> lse, kk::View3<T> dout, kk::View3<A> dq,
                       kk::View3<A> dk, kk::View3<A> dv, const kk::AttnOptions& opt) {
  if constexpr (isa == Isa::AmxNoTiles)
    return kk::detail::attention_bwd_amx_no_tiles(p.q, p.k, p.v, o, lse, dout, p.mask, dq, dk, dv,
                                                  kk::detail::resolve_scale<float>(opt, p.q.extent(2)), opt.tile_q,
                                                  opt.tile_k);
  else
    return kk::attention_bwd<T>(p.q, p.k, p.v, o, lse, dout, p.mask, dq, dk, dv, opt);
}

template <class T, Isa isa = Isa::Auto>
void BM_AttentionFwd(benchmark::State& state) {
  const int64_t S = state.range(0), D = state.range(1);
  const bool causal = state.range(2) != 0;
  const kk::AttnOptions opt = tile_options(state);
  const IsaScope scope(isa);
  AttnProblem<T> p(S, D, causal);
  kk::View3<kk::acc_t<T>> o("o", S, kHeads, D);
  kk::View2<kk::acc_t<T>> lse("lse", S, kHeads);
  Kokkos::fence();
  double exec_flops = 0;
  for (auto _ : state) {
    const kk::AttnStats st = forward<T, isa>(p, o, lse, opt);
    Kokkos::fence();
    exec_flops = st.flops;
    benchmark::DoNotOptimize(o.data());
    benchmark::DoNotOptimize(lse.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOPS"] = benchmark::Counter(kk::attention_fwd_useful_flops(S, S, D, kHeads, causal),
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.counters["exec_FLOPS"] = benchmark::Counter(exec_flops, benchmark::Counter::kIsIterationInvariantRate);
}

template <class T, Isa isa = Isa::Auto>
void BM_AttentionBwd(benchmark::State& state) {
  using A = kk::acc_t<T>;
  const int64_t S = state.range(0), D = state.range(1);
  const bool causal = state.range(2) != 0;
  const kk::AttnOptions opt = tile_options(state);
  const IsaScope scope(isa);
  AttnProblem<T> p(S, D, causal);
  kk::View3<T> dout("dout", S, kHeads, D);
  kk::View3<A> o("o", S, kHeads, D), dq("dq", S, kHeads, D), dk("dk", S, kKvHeads, D), dv("dv", S, kKvHeads, D);
  kk::View2<A> lse("lse", S, kHeads);
  fill_random(dout, 14);
  kk::attention_fwd<T>(p.q, p.k, p.v, p.mask, o, lse);
  const kk::View3<T> os = kk::as_stored<T>(o);
  Kokkos::fence();
  double exec_flops = 0;
  // dq, dk, dv accumulate across iterations; the cost does not depend on their values.
  for (auto _ : state) {
    const kk::AttnStats st = backward<T, isa>(p, os, lse, dout, dq, dk, dv, opt);
    Kokkos::fence();
    exec_flops = st.flops;
    benchmark::DoNotOptimize(dq.data());
    benchmark::DoNotOptimize(dk.data());
    benchmark::DoNotOptimize(dv.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOPS"] = benchmark::Counter(kk::attention_bwd_useful_flops(S, S, D, kHeads, causal),
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.counters["exec_FLOPS"] = benchmark::Counter(exec_flops, benchmark::Counter::kIsIterationInvariantRate);
}

// Attention sizes: defaults, or the lists given by --seq, --head-dim, --causal (see parse).
std::vector<int64_t> g_seq = {1024, 4096}, g_dim = {64, 128}, g_causal = {0, 1};

void AttentionArgs(benchmark::internal::Benchmark* b) {
  for (int64_t S : g_seq)
    for (int64_t D : g_dim)
      for (int64_t causal : g_causal) b->Args({S, D, causal, 0, 0});
}

// Tile-size sweep at S=4096, D=128 (args: S, D, causal, tile_q, tile_k).
void TileArgs(benchmark::internal::Benchmark* b) {
  for (int64_t causal : {0, 1})
    for (int64_t tq : {64, 128, 256})
      for (int64_t tk : {64, 128, 256, 512}) b->Args({4096, 128, causal, tq, tk});
}

// Google Benchmark's own arguments (--benchmark_*), handed to benchmark::Initialize.
std::vector<std::string> g_bench_args;

// What Google Benchmark writes with --benchmark_out (JSON format): its context and results.
bool google_benchmark_json(const minicp::harness::Json& j) {
  return j.is_object() && j.contains("context") && j.contains("benchmarks");
}

// Options -> the globals above, every check, before Kokkos starts: Google Benchmark's flags
// are checked here too, and the attention buffers of the largest case must fit in memory.
void parse(const minicp::harness::Args& a) {
  namespace hn = minicp::harness;
  CLI::App app{"minicp-kernels-bench: Google Benchmark timings of the miniCP kernels (fp32; BM_Bf16Gemm: bf16).",
               a.prog()};
  app.allow_extras();  // Google Benchmark's --benchmark_* flags
  hn::add_int_list(app, "--seq", g_seq, 1, hn::kNoMax, "attention sequence lengths S, tokens (comma list)");
  hn::add_int_list(app, "--head-dim", g_dim, 2, hn::kNoMax, "attention head dims D, even (comma list)");
  hn::add_int_list(app, "--causal", g_causal, 0, 1, "0 full, 1 causal (comma list)");
  hn::add_int(app, "--heads", kHeads, 1, hn::kNoMax, "query heads = kv heads");
  bool overwrite = false;
  app.add_flag("--overwrite", overwrite,
               "replace an existing --benchmark_out that is not a Google Benchmark JSON file (default: off)");
  app.footer(
      "Counters: FLOPS = useful FLOP/s (formulas of docs/figures-of-merit.md), exec_FLOPS = executed FLOP/s.\n"
      "Kokkos flags (--kokkos-threads=N or --kokkos-num-threads=N, 1 to 512) go to Kokkos. Exit status: 0 ok, 2 bad "
      "command line.\n"
      "Google Benchmark's own flags:");
  hn::parse(app, a, [] { benchmark::PrintDefaultHelp(); });
  for (int64_t D : g_dim)
    if (D % 2) throw hn::UsageError("--head-dim " + std::to_string(D) + ": must be even and >= 2");
  // A MINICP_ATTENTION_ISA the kernels refuse (unknown, or a path this CPU cannot run) is bad
  // input, refused before anything runs, as by the other programs that run attention.
  if (const std::string e = kk::attention_isa_error(); !e.empty()) throw hn::UsageError(e);
  kKvHeads = kHeads;

  g_bench_args.assign(1, a.args()[0]);
  for (const std::string& x : app.remaining()) {
    // Google Benchmark truncates its --benchmark_out before it runs anything: checked here as
    // every output is (a file of its own kind, a Google Benchmark JSON, or --overwrite).
    if (x.rfind("--benchmark_out=", 0) == 0)
      hn::check_outputs(a, {{"--benchmark_out", x.substr(16), "a Google Benchmark JSON file", google_benchmark_json}},
                        overwrite);
    g_bench_args.push_back(x);
  }
  std::vector<char*> argv;
  for (std::string& x : g_bench_args) argv.push_back(x.data());
  argv.push_back(nullptr);
  int argc = int(g_bench_args.size());
  benchmark::Initialize(&argc, argv.data());
  if (argc > 1) {
    std::string unknown;
    for (int i = 1; i < argc; ++i) unknown += std::string(unknown.empty() ? "" : " ") + argv[i];
    throw hn::UsageError("unrecognised argument(s): " + unknown + " (see --help)");
  }

  // The attention buffers of the largest case: q, k, v, o, dout, dq, dk, dv [S,H,D] and lse
  // [S,H], fp32 (counted in double: S near 2^63 must read as too much, not wrap).
  const int64_t S = *std::max_element(g_seq.begin(), g_seq.end());
  const int64_t D = *std::max_element(g_dim.begin(), g_dim.end());
  const double bytes = (8.0 * double(S) * kHeads * double(D) + double(S) * kHeads) * sizeof(float);
  hn::check_memory(
      a, "--seq " + std::to_string(S) + " --heads " + std::to_string(kHeads) + " --head-dim " + std::to_string(D),
      bytes, 1);
}

int run(const minicp::harness::Args&) {
  for (auto [name, fn] : {std::pair{"BM_Sgemm", &BM_Gemm<float>}, std::pair{"BM_Bf16Gemm", &BM_Gemm<kk::bf16>}}) {
    auto* b = benchmark::RegisterBenchmark(name, fn)->Arg(512)->Arg(1024)->Arg(2048);
    // A GPU's GEMM ceiling needs a larger problem than 2048^3 (under a millisecond there);
    // on a CPU 8192^3 takes seconds per iteration and adds nothing 2048^3 does not show.
    if (!kk::kHostMemory) b->Arg(8192);
    b->UseRealTime()->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("BM_TileGemm", BM_TileGemm<false>)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("BM_Bf16TileGemm", BM_TileGemm<true>)->UseRealTime()->Unit(benchmark::kMillisecond);
  using Fn = void (*)(benchmark::State&);
  const std::pair<const char*, Fn> attention[] = {
      {"BM_AttentionFwd", &BM_AttentionFwd<float>},
      {"BM_AttentionBwd", &BM_AttentionBwd<float>},
      {"BM_AttentionFwdBf16", &BM_AttentionFwd<kk::bf16>},
      {"BM_AttentionBwdBf16", &BM_AttentionBwd<kk::bf16>},
      {"BM_AttentionFwdBf16Plain", &BM_AttentionFwd<kk::bf16, Isa::Plain>},
      {"BM_AttentionBwdBf16Plain", &BM_AttentionBwd<kk::bf16, Isa::Plain>},
      {"BM_AttentionFwdBf16AmxNoTiles", &BM_AttentionFwd<kk::bf16, Isa::AmxNoTiles>},
      {"BM_AttentionBwdBf16AmxNoTiles", &BM_AttentionBwd<kk::bf16, Isa::AmxNoTiles>}};
  for (auto [name, fn] : attention)
    benchmark::RegisterBenchmark(name, fn)->Apply(AttentionArgs)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("BM_AttentionFwdTiles", BM_AttentionFwd<float>)
      ->Apply(TileArgs)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("BM_AttentionBwdTiles", BM_AttentionBwd<float>)
      ->Apply(TileArgs)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::AddCustomContext("kokkos_exec_space", kk::Exec::name());
  benchmark::AddCustomContext("kokkos_concurrency", std::to_string(kk::Exec().concurrency()));
  benchmark::AddCustomContext("gemm_backend", kk::gemm_backend());
  benchmark::AddCustomContext("gemm_bf16_engine", kk::gemm_bf16_engine());
  const minicp::harness::BlasInfo blas = minicp::harness::blas_info();  // the SGEMM reference's BLAS and core
  benchmark::AddCustomContext("blas", blas.summary());
  if (!blas.warning.empty()) benchmark::AddCustomContext("blas_warning", blas.warning);
  benchmark::AddCustomContext("attention_heads", std::to_string(kHeads));
  benchmark::AddCustomContext("attention_isa", kk::attention_isa());  // the path of the *Bf16 families
  // The bf16 paths MINICP_ATTENTION_ISA may name here (at the largest head_dim), and why not
  // the others: the kernel study times each.
  std::string usable, refused;
  for (const kk::AttnPathRate& r : kk::attention_paths_here(int(*std::max_element(g_dim.begin(), g_dim.end())))) {
    if (r.refused.empty())
      usable += (usable.empty() ? "" : ",") + r.isa;
    else
      refused += (refused.empty() ? "" : "; ") + r.isa + ": " + r.refused;
  }
  benchmark::AddCustomContext("attention_paths_usable", usable);
  benchmark::AddCustomContext("attention_paths_refused", refused);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return minicp::harness::main_serial(argc, argv, "minicp-kernels-bench", parse, run); }
