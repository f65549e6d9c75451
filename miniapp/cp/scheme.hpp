// The interface every CP scheme fills, and the registry table the driver, the tests and
// the benchmarks loop over. A new scheme is one file in miniapp/cp/ that returns a
// SchemeInfo, plus one line in registry.cpp.
#pragma once
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "comm/comm.hpp"
#include "kernels/attention.hpp"
#include "miniapp/cp/mask.hpp"
#include "miniapp/cp/schedule.hpp"

namespace minicp::cp {

using kernels::CView2;
using kernels::CView3;
using kernels::View1;
using kernels::View2;
using kernels::View3;

// full: compute and communicate; compute-only: communication skipped (blocks are reused, so
// the numbers are wrong but the work is the same); comm-only: compute skipped.
enum class Mode { Full, ComputeOnly, CommOnly };
Mode parse_mode(const std::string& s);
const char* to_string(Mode m);

// The problem a call solves: train (forward and backward over the whole sequence of seq_len
// tokens) or decode (decode_tokens new query tokens at positions seq_len.. against a KV cache
// of seq_len tokens, forward only).
enum class Problem { Train, Decode };
const char* to_string(Problem p);

struct Config {
  Problem problem = Problem::Train;
  int64_t seq_len = 0;  // S, global tokens (decode: the KV-cache length)
  int heads = 8;        // H, query heads
  int kv_heads = 8;     // Hkv, key/value heads (GQA when < heads)
  int head_dim = 64;    // D
  Mask mask;            // which keys each query sees (miniapp/cp/mask.hpp)
  // A dispatch's tokens of each rank (miniapp/cp/dispatch.hpp), for a scheme that takes one
  // (SchemeInfo::takes_dispatch); null: the scheme's own layout. `dispatch` names it.
  std::shared_ptr<const std::vector<std::vector<int64_t>>> tokens;
  std::string dispatch;
  int ranks = 1;          // P, ranks of the CP group
  int decode_tokens = 1;  // T, decode: query tokens after the cache (train: unused)
  // The schemes' own settings by name: each is declared (help, default, minimum) by the
  // Setting entry of the scheme that reads it, in that scheme's file, and nowhere else. The
  // constructor holds every registered setting at its default.
  std::map<std::string, int> settings;
  // The value of setting `name`; throws std::logic_error when no scheme registers it.
  int setting(const std::string& name) const;
  Mode mode = Mode::Full;
  // bf16 runs: the dK/dV accumulators that travel a ring backward are bf16 (rounded at every
  // hop) instead of fp32. No effect on fp32 and fp64 runs.
  bool bf16_dkv = false;
  kernels::AttnOptions attn;  // kernel options (tile sizes)
  Config();
};

// What one call measured on this rank (bytes sent: Context::bytes_sent).
struct Stats {
  double compute_s = 0;     // time in attention kernels (fenced)
  double comm_wait_s = 0;   // time blocked waiting for communication
  double flops = 0;         // executed attention FLOPs
  int blocks_computed = 0;  // (step) blocks computed
  int blocks_skipped = 0;   // (step) blocks skipped as fully masked
  void reset() { *this = Stats{}; }
};

struct Context {
  Context(comm::Communicator& c, const Config& config) : comm(c), cfg(config), bytes_base_(c.bytes_sent()) {}
  comm::Communicator& comm;
  Config cfg;
  Stats stats;
  int step = 0;  // set by at_step
  // The scheme is at its step s: stamped on its trace events, told to the stall watchdog.
  void at_step(int s);
  // Bytes that left this rank (comm::bytes_leaving of every call) since the context was
  // created or last reset: read from the communicator, which counts every call it makes.
  int64_t bytes_sent() const { return comm.bytes_sent() - bytes_base_; }
  // Zeroes the stats and the byte count (e.g. after an untimed forward).
  void reset() {
    stats.reset();
    bytes_base_ = comm.bytes_sent();
  }
  // Positions gathered in full mode, keyed by (group id, this rank's positions): compute-only
  // mode reads them here instead of gathering (allgather_positions), so it communicates
  // nothing once a full-mode call has run. Every rank makes the same calls in the same order,
  // so every rank finds or misses an entry at the same call.
  std::map<std::pair<int, std::vector<int64_t>>, std::vector<std::vector<int64_t>>> gathered_positions;

 private:
  int64_t bytes_base_;
};

// Global token indices of the local rows: q rows of Q/O/dQ, kv rows of K/V/dK/dV.
// Indices are also the global positions (tree: queries sit after the cache).
struct Shard {
  std::vector<int64_t> q, kv;
};

// T is the stored value type (fp64, fp32 or bf16); the LSE is in kernels::acc_t<T> (fp32 for
// bf16), and so is every partial result a scheme merges before it rounds into o, dq, dk, dv.
template <class T>
class Scheme {
 public:
  using A = kernels::acc_t<T>;
  virtual ~Scheme() = default;
  // q[Sq,H,D], k,v[Skv,Hkv,D] (local rows, Shard order) -> o[Sq,H,D], lse[Sq,H].
  virtual void forward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, View3<T> o, View2<A> lse) = 0;
  // Given the forward's o, lse and dout[Sq,H,D] -> dq, dk, dv (overwritten).
  virtual void backward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<A> lse, CView3<T> dout,
                        View3<T> dq, View3<T> dk, View3<T> dv) = 0;
};

// One integer setting a scheme reads from Config::settings. Drivers register them from the
// registry (flag --<name with '-' for '_'>, deck key sweep.<name>, a column of the results
// and of the analysis tables), so a scheme's settings, their help and their defaults live in
// its own file.
struct Setting {
  std::string name;  // "chunks"
  std::string help;  // what it does, with units
  int default_value = 0;
  int min_value = 0;  // smallest allowed value (0 often means "default rule")
  // The value that runs for a config on a communicator of this topology (a default rule
  // resolved); unset: the configured value itself. What the results file records.
  std::function<int(const Config&, const comm::Topology&)> resolve;
};

// A scheme's buffers, in values of the stored type, for a forward then its backward: `shared`
// scratch serves every object of the scheme (one per layer) in turn; `per_object` is held by
// each object between calls (kept K/V blocks, the Ulysses engine's head-sharded tensors, and
// scratch named by a group the object splits for itself). shared and per_object are a run's
// whose accumulator is its stored type (fp32, fp64); narrow_* the same for a bf16 run, in
// bf16 values: its fp32 buffers count two each, and it holds fp32 accumulators the others
// need not (an fp32 run accumulates O, dQ, dK, dV in the outputs themselves).
struct Workspace {
  double shared = 0, per_object = 0;
  double narrow_shared = 0, narrow_per_object = 0;
  // Values of elem bytes (2: bf16) held by `objects` objects of the scheme.
  double values(size_t elem, double objects) const {
    return elem < sizeof(float) ? narrow_shared + objects * narrow_per_object : shared + objects * per_object;
  }
};

// What one buffer value of each kind costs, in values of the stored type: an acc_t value
// (`acc`: 1, or 2 for bf16's fp32), a value of a dK/dV accumulator that travels (`dkv`: as
// acc, or 1 with Config::bf16_dkv); `extra` (0 or 1) multiplies the buffers only a bf16 run
// holds (the fp32 accumulators of its outputs, its outputs rounded before they are sent).
struct Units {
  double acc = 1, dkv = 1, extra = 0;
};
// The workspace a rule gives in the units of an fp32/fp64 run and in those of a bf16 run of c
// (the rule fills shared and per_object).
template <class Rule>
Workspace by_precision(const Config& c, const Rule& rule) {
  Workspace w = rule(Units{});
  const Workspace n = rule(Units{2, c.bf16_dkv ? 1.0 : 2.0, 1});
  w.narrow_shared = n.shared;
  w.narrow_per_object = n.per_object;
  return w;
}

struct SchemeInfo {
  std::string name;
  std::string summary;
  std::vector<Problem> problems = {Problem::Train};  // the problems it can solve
  std::vector<Setting> settings;
  // What the scheme refuses, in words, for --list-schemes (check() gives the concrete reason).
  std::string refuses;
  // It passes blocks (K/V or Q) around a ring step by step: one compute and one transfer per
  // ring step, the timeline the plots draw for it.
  bool ring_family = false;
  // Its layout is a choice: Config::tokens (a dispatch) replaces it.
  bool takes_dispatch = false;
  // "" when cfg can run, else one sentence naming the constraint and the values.
  std::function<std::string(const Config&)> check;
  // The local rows of rank r (a layout function from miniapp/cp/layout.hpp).
  std::function<Shard(const Config&, int)> shard;
  // Values of the scheme's own buffers on the rank that needs most, forward and backward;
  // the tensors it is handed are not counted.
  std::function<Workspace(const Config&)> workspace;
  // The scheme's steps on world rank r of a job laid out as topo, forward or backward, as the
  // performance model sees them (miniapp/cp/schedule.hpp); elem: bytes per stored value (2
  // for bf16, whose fp32 partials and accumulators travel at 4 bytes per value).
  std::function<predict::Schedule(const Config&, const predict::Topo&, int r, bool backward, size_t elem)> schedule;
  std::function<std::unique_ptr<Scheme<float>>()> make_f32;
  std::function<std::unique_ptr<Scheme<double>>()> make_f64;
  std::function<std::unique_ptr<Scheme<kernels::bf16>>()> make_bf16;

  bool solves(Problem p) const { return std::find(problems.begin(), problems.end(), p) != problems.end(); }
  bool has_backward() const { return solves(Problem::Train); }
};

// values * elem bytes as int64, saturating (a seq_len near 2^63 must read as "too much").
inline int64_t bytes_of(double values, size_t elem) {
  const double b = values * double(elem);
  return b >= 9.2e18 ? INT64_MAX : int64_t(b);
}

// The fp32, fp64 and bf16 factories of a scheme class template Impl<T> built from args (copied).
template <template <class> class Impl, class... Args>
SchemeInfo make_info(std::string name, std::string summary, Args... args) {
  SchemeInfo s;
  s.name = std::move(name);
  s.summary = std::move(summary);
  s.make_f32 = [args...] { return std::unique_ptr<Scheme<float>>(new Impl<float>(args...)); };
  s.make_f64 = [args...] { return std::unique_ptr<Scheme<double>>(new Impl<double>(args...)); };
  s.make_bf16 = [args...] { return std::unique_ptr<Scheme<kernels::bf16>>(new Impl<kernels::bf16>(args...)); };
  return s;
}

// The scheme object of s for value type T (fp32, fp64 or bf16); throws
// when s has no implementation in T (a programming error: std::logic_error).
template <class T>
std::unique_ptr<Scheme<T>> make_scheme(const SchemeInfo& s) {
  const auto& make = [&]() -> const std::function<std::unique_ptr<Scheme<T>>()>& {
    if constexpr (std::is_same<T, float>::value)
      return s.make_f32;
    else if constexpr (std::is_same<T, double>::value)
      return s.make_f64;
    else
      return s.make_bf16;
  }();
  if (!make) throw std::logic_error("scheme " + s.name + " has no " + kernels::dtype_name<T>() + " implementation");
  return make();
}

const std::vector<SchemeInfo>& registry();
// Throws std::invalid_argument listing the known schemes.
const SchemeInfo& find(const std::string& name);
// Common checks (positive sizes, heads % kv_heads, settings >= their minimum) then the
// scheme's own.
std::string check(const SchemeInfo& s, const Config& cfg);
// Every setting of every scheme once, in registry order (settings of the same name are one).
std::vector<Setting> all_settings();
// The registry as JSON (minicp --list-schemes --json, the results file's scheme_registry
// attribute, minicp-fidelity's scheme_registry): [{name, summary, problems, ring_family,
// refuses, settings: [{name, help, default, min}]}] in registry order, what the tests and the
// analysis read the schemes from. indent < 0: one line.
std::string registry_json(int indent = -1);

// Global query tokens of the problem (decode: decode_tokens), and the position of the first
// (decode: the queries sit right after the seq_len cache tokens).
int64_t global_q_tokens(const Config& cfg);
int64_t first_q_position(const Config& cfg);
// Positions of the decode queries: seq_len .. seq_len + decode_tokens - 1.
std::vector<int64_t> decode_positions(const Config& cfg);

// Bytes per rank of the attention tensors a caller hands the scheme on the rank that holds
// most rows (q, o, dout, dq [Sq,H,D]; k, v, dk, dv [Skv,Hkv,D]; lse [Sq,H] in acc_t; the
// backward ones only for train, with the backward kernel's row term [Sq,H] in acc_t), plus
// the scheme's workspace for one object, for elem-byte stored values.
int64_t predicted_bytes(const SchemeInfo& s, const Config& cfg, size_t elem);

// Helpers shared by the scheme files.
Kokkos::View<int64_t*, kernels::Mem> to_device(const std::vector<int64_t>& v, const char* label);
kernels::AttnMask make_mask(const Config& cfg, const std::vector<int64_t>& qpos, const std::vector<int64_t>& kpos);
// True when no (query, key) pair of the two position sets is visible under cfg's mask.
bool fully_masked(const Config& cfg, const std::vector<int64_t>& qpos, const std::vector<int64_t>& kpos);

}  // namespace minicp::cp
