// The interface every CP scheme fills, and the registry table the driver, the tests and
// the benchmarks loop over. A new scheme is one file in miniapp/cp/ that returns a
// SchemeInfo, plus one line in registry.cpp.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "kernels/attention.hpp"

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

struct Config {
  int64_t seq_len = 0;     // S, global tokens (tree: the KV-cache length)
  int heads = 8;           // H, query heads
  int kv_heads = 8;        // Hkv, key/value heads (GQA when < heads)
  int head_dim = 64;       // D
  bool causal = true;
  int64_t window = 0;      // sliding window in tokens (0 = none; implies causal)
  int64_t doc_len = 0;     // packed documents of doc_len tokens (0 = one document)
  int ranks = 1;           // P, ranks of the CP group
  int ulysses = 0;         // usp: Ulysses group size (0 = default rule, see usp.cpp)
  int inner_ring = 0;      // doublering: inner ring size (0 = default rule, see doublering.cpp)
  int decode_tokens = 1;   // tree: query tokens decoded against the cache
  int chunks = 4;          // allgather: chunks the gather is cut into
  Mode mode = Mode::Full;
  kernels::AttnOptions attn;  // kernel options (tile sizes)
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
  int step = 0;  // set by schemes for trace events
  // Bytes that left this rank (comm::bytes_leaving of every call) since the context was
  // created or last reset: read from the communicator, which counts every call it makes.
  int64_t bytes_sent() const { return comm.bytes_sent() - bytes_base_; }
  // Zeroes the stats and the byte count (e.g. after an untimed forward).
  void reset() {
    stats.reset();
    bytes_base_ = comm.bytes_sent();
  }

 private:
  int64_t bytes_base_;
};

// Global token indices of the local rows: q rows of Q/O/dQ, kv rows of K/V/dK/dV.
// Indices are also the global positions (tree: queries sit after the cache).
struct Shard {
  std::vector<int64_t> q, kv;
};

template <class T>
class Scheme {
 public:
  virtual ~Scheme() = default;
  // q[Sq,H,D], k,v[Skv,Hkv,D] (local rows, Shard order) -> o[Sq,H,D], lse[Sq,H].
  virtual void forward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, View3<T> o, View2<T> lse) = 0;
  // Given the forward's o, lse and dout[Sq,H,D] -> dq, dk, dv (overwritten).
  virtual void backward(Context& ctx, CView3<T> q, CView3<T> k, CView3<T> v, CView3<T> o, CView2<T> lse,
                        CView3<T> dout, View3<T> dq, View3<T> dk, View3<T> dv) = 0;
};

struct SchemeInfo {
  std::string name;
  std::string summary;
  bool has_backward = true;
  // "" when cfg can run, else one sentence naming the constraint and the values.
  std::function<std::string(const Config&)> check;
  // The local rows of rank r (a layout function from miniapp/layout.hpp).
  std::function<Shard(const Config&, int)> shard;
  std::function<std::unique_ptr<Scheme<float>>()> make_f32;
  std::function<std::unique_ptr<Scheme<double>>()> make_f64;
};

const std::vector<SchemeInfo>& registry();
// Throws std::invalid_argument listing the known schemes.
const SchemeInfo& find(const std::string& name);
// Common checks (positive sizes, heads % kv_heads) then the scheme's own.
std::string check(const SchemeInfo& s, const Config& cfg);

// Global query/key counts of the problem a config describes.
int64_t global_q_tokens(const Config& cfg, const std::string& scheme);

// Helpers shared by the scheme files.
Kokkos::View<int64_t*, kernels::Mem> to_device(const std::vector<int64_t>& v, const char* label);
kernels::AttnMask make_mask(const Config& cfg, const std::vector<int64_t>& qpos, const std::vector<int64_t>& kpos);
// True when no (query, key) pair of the two position sets is visible under cfg's mask.
bool fully_masked(const Config& cfg, const std::vector<int64_t>& qpos, const std::vector<int64_t>& kpos);

}  // namespace minicp::cp
