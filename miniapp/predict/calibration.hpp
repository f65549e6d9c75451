// The calibration table: the kernel rates and link figures the performance model turns
// schedules into time with, measured on one machine by `minicp --calibrate` (or at the start
// of a run) or written by hand for a machine this build cannot run on (a GPU node). A table is
// a text file, one row per line, so tables measured with other thread counts or under other
// fabrics are combined with `cat`:
//
//   sgemm   THREADS FLOP/S                          BLAS SGEMM 2048^3 per rank: the drift reference
//   gemm    DTYPE THREADS OPS M N K FLOP/S          one GEMM shape (OPS: NN, NT, TN)
//   attn    DTYPE THREADS PASS D TQ TK FULL PARTIAL CALL [TOUCHED [ITEM]]
//                                                   seconds per (tile, head) of a fully visible tile
//                                                   and of a partly masked one (scaled by the part
//                                                   of a whole tile's area it has), per call, per
//                                                   (tile, head) touched whatever its area, and per
//                                                   work item whatever the mask leaves it (forward:
//                                                   a query head's query tile; backward: a K/V
//                                                   head's key tile); PASS fwd | bwd, tiles TQ x TK
//   elem    DTYPE THREADS OP SECONDS                seconds per value of an element-wise kernel
//                                                   (rmsnorm_fwd, rmsnorm_bwd, rope, swiglu_fwd,
//                                                   swiglu_bwd, copy)
//   link    FABRIC SCOPE ALPHA_S BETA_B/S CPU_B/S [ALLREDUCE_B/S]
//                                                   a link (SCOPE intra | inter node): latency,
//                                                   bandwidth, the rate at which a CPU copies
//                                                   what it carries (0: no CPU copy, RDMA), and
//                                                   the bytes per second of a layer's gradient
//                                                   all-reduce, its 8 MiB buckets back to back
//                                                   (bytes_leaving; optional)
//   busy    FABRIC SCOPE KIND WIRE_B/S CPU_B/S      the link beside compute (KIND p2p: an exchange
//                                                   as a ring step; allreduce: 8 MiB buckets as the
//                                                   weight gradients): bytes_leaving per second
//                                                   while every rank runs GEMMs, and bytes moved per
//                                                   second of compute time lost to them (0: none)
//   coll    FABRIC SCOPE OP GROUP PAYLOAD SECONDS   one blocking collective as a scheme waits for it
//                                                   before its compute (OP alltoall, allgather,
//                                                   reduce_scatter, allreduce over GROUP ranks;
//                                                   PAYLOAD: comm::bytes_leaving's argument): the
//                                                   mean seconds of its slowest member per call
//   posted  FABRIC SCOPE OP GROUP PAYLOAD SECONDS   a non-blocking collective as a pipelined pass
//                                                   posts it (OP allgather, reduce_scatter): 4 calls
//                                                   a chunk, the next chunk's posted before the
//                                                   current one's are waited for, about 2 ms of GEMMs
//                                                   a chunk; the seconds per call posted beside
//                                                   compute that the compute did not hide (the
//                                                   slowest member's mean; 0: all hidden)
//   layer   DTYPE THREADS C HD KD F N FWD_S BWD_S   one layer of the model as it runs (compute-only
//           [GEMM_FWD_S GEMM_BWD_S [RANKS]]         mode, RANKS ranks computing at once, all when
//                                                   absent): the seconds of its
//                                                   phases other than attention, forward and backward
//                                                   (0: not measured), at N rows per rank, for hidden
//                                                   C, query width HD = heads x head_dim, key/value
//                                                   width KD, ffn F; optionally the seconds of its
//                                                   GEMMs each in its own loop, timed in the same
//                                                   seconds; the model scales the kernels' own rates
//                                                   by the layer over its kernels (its GEMMs as timed
//                                                   beside it, else the table's rates) at row counts
//                                                   within 2x of N
//   info    KEY VALUE...                            where it was measured (host, cpu, date, ...)
//
// Rates are per rank, with THREADS threads per rank and every rank of the calibrating job
// measuring at once (as the ranks of a run compute at once). DTYPE is the stored type the
// kernels ran on (f32, f64, bf16: a bf16 row times the bf16 kernels, which sum in fp32); a
// deck is predicted from rows of its run.dtype only, and --calibrate measures that one. The
// attention rows are per head_dim D (the calibrated deck's); another head_dim takes the
// nearest D's rows scaled by the ratio of the two, noted in the prediction. '#' starts a comment.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "miniapp/cp/schedule.hpp"
#include "miniapp/model/model.hpp"

namespace minicp::predict {

struct GemmRate {
  std::string dtype, ops;  // "f32", "NN"
  int threads = 1;
  int64_t m = 0, n = 0, k = 0;
  double flops_per_s = 0;
};
struct AttnRate {
  std::string dtype;
  int threads = 1;
  bool backward = false;
  int head_dim = 0, tile_q = 0, tile_k = 0;
  double full_s = 0, partial_s = 0, call_s = 0;
  double tile_s = 0;  // per tile touched, whatever its area (K/V loads); optional column
  // Per work item (forward: a query head's query tile; backward: a K/V head's key tile), each
  // of which loads its tile, clears its buffers and finishes its rows however few tiles the
  // mask leaves it: a call of short documents is mostly that. Optional column.
  double item_s = 0;
};
struct ElemRate {
  std::string dtype, op;
  int threads = 1;
  double s_per_value = 0;
};
struct LinkRate {
  std::string fabric, scope;  // scope: intra | inter
  double alpha_s = 0, beta_Bps = 0, cpu_Bps = 0;
  double allreduce_Bps = 0;  // a layer's 8 MiB buckets all-reduced: bytes_leaving per second (0: not measured)
};

// A link's traffic beside compute: what the run's overlapped transfers see.
struct BusyRate {
  std::string fabric, scope, kind;  // kind: p2p | allreduce
  double wire_Bps = 0;              // bytes_leaving per second of the transfer while the ranks compute
  double cpu_Bps = 0;               // bytes_leaving per second of compute lost (0: no loss measured)
};

// A blocking collective timed at one size: what a scheme's exposed calls cost (the calls'
// own algorithm, the progress setting of the run, the tail of slow calls), where alpha-beta
// from a pingpong reads a fraction of it.
struct CollTime {
  std::string fabric, scope, op;  // op: comm::to_string of the EventKind
  int group = 2;
  int64_t payload = 0;  // bytes, as comm::bytes_leaving takes it
  double seconds = 0;   // mean per call, of the slowest member
  // A `posted` row: the call posted non-blocking beside compute as a pipelined pass posts it;
  // seconds per call not hidden by the compute. Under UCX over TCP here, 8 gathers of 32 KiB
  // posted beside 2.5 ms of compute took 13 ms more than the compute (ob1: 2 ms), where one
  // such gather alone, waited for at once, takes 34 us: the cost is the library's, per call.
  bool posted = false;
  // What one row stands for: a newer row of the same key replaces it.
  auto key() const { return std::make_tuple(fabric, scope, posted, op, group, payload); }
};

// One layer's kernels other than attention, timed as the layer runs them: between the kernels
// of a layer its activations and weights move through the caches, and in a run every rank
// computes at once; the kernels' own rates, each timed in a loop of its own, read up to 12%
// faster than that on the development machine. The layer's GEMMs are timed again in their own
// loops in the same seconds (interleaved with the layer's steps), so that the model takes the
// ratio of the two from one moment: the host's speed drifts by up to 30% between the table's
// GEMM rows and its layer rows.
struct LayerTime {
  std::string dtype;
  int threads = 1;
  int64_t hidden = 0, q_width = 0, kv_width = 0, ffn = 0;  // C, heads x head_dim, kv_heads x head_dim, F
  int64_t rows = 0;                                        // N, tokens per rank
  double forward_s = 0, backward_s = 0;                    // one layer; backward 0: not measured
  double gemm_forward_s = 0, gemm_backward_s = 0;          // its GEMMs alone, beside it; 0: not measured
  int ranks = 0;  // ranks computing at once on the host while it was measured; 0: not recorded
  // What one row stands for: a newer row of the same key replaces it.
  auto key() const { return std::make_tuple(dtype, threads, hidden, q_width, kv_width, ffn, rows, ranks); }
};

struct Calibration {
  std::string source;  // the file, or "measured at start-up"
  // Measured by the run whose cases are predicted (at its start-up, its layer rows again each
  // round): the rows hold that run's speed, and the drift scale of its cases is not theirs.
  bool of_the_run = false;
  std::map<int, double> sgemm;  // threads -> SGEMM 2048^3 FLOP/s per rank
  std::vector<GemmRate> gemm;
  std::vector<AttnRate> attn;
  std::vector<ElemRate> elem;
  std::vector<LinkRate> links;
  std::vector<BusyRate> busy;
  std::vector<CollTime> colls;
  std::vector<LayerTime> layers;
  std::vector<std::pair<std::string, std::string>> info;

  std::string text() const;  // the file format above
  void merge(const Calibration& o);
  // Lookups; nullptr when the table has nothing that fits. gemm: the exact shape, else the
  // nearest shape (log distance) of the same ops, else of any ops. attn: the nearest head_dim
  // (the first of two as near).
  const GemmRate* find_gemm(const std::string& dtype, int threads, const std::string& ops, int64_t m, int64_t n,
                            int64_t k) const;
  const AttnRate* find_attn(const std::string& dtype, int threads, bool backward, int head_dim) const;
  const ElemRate* find_elem(const std::string& dtype, int threads, const std::string& op) const;
  const LinkRate* find_link(const std::string& fabric, const std::string& scope) const;
  const BusyRate* find_busy(const std::string& fabric, const std::string& scope, const std::string& kind) const;
  // The layer row of this shape whose rows are nearest N (log distance), within 2x of N.
  // The row of this shape nearest `rows` (within 2x) among those measured with `ranks`
  // computing at once, else with the nearest number (a row that records none matches any).
  const LayerTime* find_layer(const std::string& dtype, int threads, const model::Shape& shape, int64_t rows,
                              int ranks = 0) const;
  // The thread counts the table has rates for.
  std::vector<int> threads() const;
};

// The collectives a coll row may name: those a scheme waits for before its compute.
bool is_coll_row_op(const std::string& op);

// Throws std::runtime_error naming the file, the line and what is wrong.
Calibration parse_calibration(const std::string& text, const std::string& source);
// The table in path, refused (std::runtime_error "<path>: <why>") when path is not a regular
// file of at most harness::kCalibrationFile's size (harness/input.hpp), before it is read.
Calibration read_calibration(const std::string& path);

// Layer rows measured more than once (the pieces of one row, the rounds of a run): one row per
// shape, rows and ranks, in order of first appearance, taking per pass the sample whose layer
// over its GEMMs timed beside it is the median (the upper one of an even count). The host's
// speed drifts from minute to minute; a median of samples taken at several moments is the
// row of a typical one.
std::vector<LayerTime> median_layer_rows(const std::vector<LayerTime>& samples);

}  // namespace minicp::predict
