// The performance model: an alpha-beta-gamma estimate of a case's step, per phase, from the
// scheme's own schedule (SchemeInfo::schedule), the layer's kernels (layer_ops) and a
// calibration table (calibration.hpp). Nothing is run: `minicp --predict` evaluates any deck,
// at any rank count, in one process. How each part is modelled is written out in
// docs/DESIGN.md ("The performance model"); the rules in short:
//   compute   GEMM FLOPs / the table's rate at that shape; element-wise values x seconds per
//             value; the layer's kernels together x what a layer row of the table measured
//             them to take in a running layer over their own rates (layer_factor); attention:
//             tiles counted as the tiled kernel classifies them (skipped, fully visible,
//             partly masked) x seconds per tile and head, plus a per-call cost.
//   comm      alpha-beta per call: latency terms of the op's algorithm x alpha + the bytes of
//             comm::bytes_leaving / beta, with the intra- or inter-node link; a blocking
//             collective the step waits for: its time as the table measured it (coll rows).
//   overlap   per step of the schedule: exposed calls + the overlapped traffic beside the
//             step's compute: it moves at the link's rate beside compute (a busy row of the
//             table, else the link's own), costing compute the time the table says it takes
//             from it, and what is left when the compute ends moves at the link's own rate;
//             steps are synchronous across ranks (a ring step waits for its slowest member).
//   gradients each layer's weight-gradient all-reduce is queued when its backward ends and
//             moves, in the same way, beside the backward of the layers below; what is left
//             at the end is exposed.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/attention.hpp"
#include "miniapp/cp/schedule.hpp"
#include "miniapp/cp/scheme.hpp"
#include "miniapp/model/layer.hpp"
#include "miniapp/predict/calibration.hpp"

namespace minicp::predict {

// One kernel of a layer: a GEMM (ops "NN", "NT", "TN"; C[m,n] += op(A)[m,k] op(B)[k,n]) or
// an element-wise kernel over `values` values. Listed in the order model::Stack runs them.
struct LayerOp {
  model::Phase phase;
  std::string ops;  // "" for an element-wise kernel
  int64_t m = 0, n = 0, k = 0;
  std::string elem;  // element-wise kernel (Calibration's elem names)
  double values = 0;
  double flops() const { return ops.empty() ? 0 : 2.0 * double(m) * double(n) * double(k); }
};
// The kernels of one layer on N rows, outside the attention call, forward or backward; the
// norms and residuals on n rows (-1: N; with TP's sequence parallelism N/tp). With TP, m is
// the rank's slice (model::tp_slice).
std::vector<LayerOp> layer_ops(const model::Shape& m, int64_t N, bool backward, int64_t n = -1);

// Tiles of one attention call per head, as the tiled kernel classifies them under cfg's mask.
// full, partial: tiles; the *_area ones weigh each by its rows x keys over a whole tile's
// (an edge tile, or a decode step's few queries, costs its part of a tile).
struct TileCount {
  double full = 0, partial = 0, full_area = 0, partial_area = 0;
  double q_tiles = 0, k_tiles = 0;  // the tiles of each side, whatever the mask
};
// Counted in closed form over the spans (tile_count.cpp): the cost does not grow with seq_len.
// `cut`: how a pair of tile runs whose documents are not regular is cut up (the cheapest by
// default; the tests force each, which must all agree).
enum class TileCut { Cheapest, QueryResidues, KeyResidues, QueryDocuments, KeyDocuments };
TileCount count_tiles(const cp::Config& cfg, const Spans& q, const Spans& kv, kernels::AttnTiles tiles,
                      TileCut cut = TileCut::Cheapest);
// The same over many calls under one config's mask. It keeps the query side of the last call
// (its tile runs and, for documents of several lengths, each query tile's documents): a
// scheme's steps mostly attend one rank's queries against one key block after another, and
// with a dispatch of small pieces finding the query tiles' documents dominated the count.
class TileCounter {
 public:
  explicit TileCounter(const cp::Config& cfg, TileCut cut = TileCut::Cheapest);
  ~TileCounter();
  TileCounter(const TileCounter&) = delete;
  TileCounter& operator=(const TileCounter&) = delete;
  TileCount operator()(const Spans& q, const Spans& kv, kernels::AttnTiles tiles);

 private:
  struct State;
  std::unique_ptr<State> st_;
};

// The links of a job: within a node and across nodes.
struct Link {
  double alpha_s = 0, beta_Bps = 0, cpu_Bps = 0;  // cpu_Bps 0: no CPU copy
  std::string source;
  double allreduce_Bps = 0;  // a measured large all-reduce's rate (0: alpha-beta instead)
  // Beside compute (the table's busy rows): the wire rate and the bytes per second of compute
  // lost, for exchanges (p2p) and large all-reduces; wire_Bps 0: not measured, the figures
  // above hold (a CPU copy, if any, is what compute loses).
  struct Busy {
    double wire_Bps = 0, cpu_Bps = 0;
  } busy_p2p, busy_allreduce;
  std::vector<CollTime> colls;  // collectives timed on this link (the table's coll and posted rows)
};
struct Machine {
  Calibration cal;
  Link intra, inter;
  int threads = 1;        // threads per rank the rates are taken at
  double rate_scale = 1;  // compute rates x this (a run's SGEMM now over the table's)
  Topo topo;
};
// The CP group's topology for the schedules, on a job laid out as `job`: CP rank r is job rank
// base + r*stride (the group of job rank 0), so ranks_per_node/stride CP ranks share a node.
Topo cp_topo(const comm::Mesh& mesh, const Topo& job);
// Whether the stack's TP group spans nodes of a job laid out as `job` (its collectives then
// take the inter-node link, else the intra-node one).
bool tp_spans_nodes(const model::StackConfig& cfg, const Topo& job);
// Seconds of one communicator call on a link (alpha-beta: see the top of this file), alone.
double comm_seconds(const CommCall& c, const Link& l);
// A call the step waits for before its compute (exposed): the link's coll rows of its op and
// group when it has them (the measured time at its size, linear between two sizes, else the
// nearest size's time scaled as alpha-beta scales it), else comm_seconds.
double exposed_seconds(const CommCall& c, const Link& l);
// The collectives a step posts non-blocking beside its compute and the table times so
// (`posted` rows): all-gathers and reduce-scatters.
bool posted_op(comm::EventKind op);
// Such a call beside compute: the seconds per call its compute did not hide, from the link's
// posted rows of its op and group (interpolated as exposed_seconds does); -1 without rows
// (the call then moves beside compute as the busy rows say).
double posted_seconds(const CommCall& c, const Link& l);
// The same call beside compute: its seconds, and the compute seconds it takes if all of it
// moves beside compute.
struct Beside {
  double wire_s = 0, cpu_s = 0;
};
Beside beside_compute(const CommCall& c, const Link& l);
// Transfers of `alone_s` seconds alone and `beside` beside compute, posted with `compute_s` of
// compute: the part that moves while the compute runs slows it (its share of beside.cpu_s),
// the rest moves after at the link's own rate. Returns {compute's end, the transfers' end}.
std::pair<double, double> overlap(double compute_s, double alone_s, const Beside& beside);

// The table's layer row for N rows and `ranks` computing at once on a host
// (Calibration::find_layer) over the kernels' own rates at the row's N, forward or backward:
// what running inside a layer costs the kernels of layer_ops beyond their own loops. For a
// table of the run itself (Calibration::of_the_run) the kernels' time is the table's rates
// at the row's N (the layer at that N is then the row); else the GEMMs' own time is the
// row's (timed beside the layer) when it has one, else the table's rates. 1 without a row.
double layer_factor(const model::Shape& s, int64_t N, bool backward, int ranks, const Machine& m, size_t elem);

struct Prediction {
  double step_s = 0, forward_s = 0, backward_s = 0;  // backward_s 0 without a backward
  double phase_s[model::kPhases] = {};               // summed over layers and passes
  double attn_compute_s = 0, attn_comm_s = 0;        // of the rank that computes most
  double grad_allreduce_exposed_s = 0;
  double comm_per_compute = 0;     // the ring steps' overlapped wire time / their compute, largest
  double exposed_attn_comm_s = 0;  // attention comm not hidden behind compute, per step
  double imbalance = 1;            // attention compute: max / mean over ranks
  bool tp_inter = false;           // the TP group spans nodes (its collectives on the inter-node link)
  std::vector<std::string> notes;  // what was approximated (a GEMM shape not in the table ...)
};

// Throws std::runtime_error when the table lacks what the case needs (no GEMM rate at all for
// its dtype and threads, no attention rate), naming it.
Prediction predict_step(const model::StackConfig& cfg, const cp::SchemeInfo& scheme, const Machine& m, size_t elem);

// The visible (query, key) pairs each rank's attention computes in one forward, summed over
// its query heads: the scheme's schedule's calls, each counted with tiles of one row by one
// key (count_tiles). The mask's area as the scheme shares it out, one entry per rank; their
// sum is the mask's area times the heads when every pair is computed once.
std::vector<double> attention_area(const cp::Config& c, const cp::SchemeInfo& s);

// The K/V tokens the mask needs moved in one layer's attention: for each rank, each key of
// another rank's shard (SchemeInfo::shard) that some query of its own shard sees, counted
// once. Train moves each such token's K and V forward and its dK and dV back; the bytes:
// tokens x kv_heads x head_dim x (2 elem, plus 2 dkv_elem for train). 0 on one rank.
double needed_attention_bytes(const cp::Config& c, const cp::SchemeInfo& s, size_t elem, bool train);

// Both of the above for one case at once (what its figures read).
struct MaskShare {
  std::vector<double> area;  // attention_area
  double needed_bytes = 0;   // needed_attention_bytes
};
MaskShare mask_share(const cp::Config& c, const cp::SchemeInfo& s, size_t elem, bool train);

// One line on why a scheme ranks where it does ("comm 2.1x compute per step, exposed").
std::string explain(const Prediction& p);

}  // namespace minicp::predict
