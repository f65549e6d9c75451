// Measuring a calibration table (calibration.hpp) on the job itself: `minicp --calibrate`,
// and run.calibration = "measure" at a run's start-up. Every rank measures at once, as the
// cases run; rank 0's rows stand for all.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "miniapp/predict/calibration.hpp"

namespace minicp::comm {
class Communicator;
}

namespace minicp::predict {

// What to measure: the layer shapes (attention at each one's head_dim) and rows per rank of a
// deck, in the precisions it runs (f32, f64, bf16).
struct CalibrationPlan {
  std::vector<model::Shape> shapes;
  std::vector<int64_t> rows;  // N, tokens per rank
  std::vector<std::string> dtypes;
  std::string fabric;           // the name the link rows get ("default": MPI's own choice)
  bool cpu_copy_inter = true;   // whether a CPU copies what crosses nodes (false for RDMA fabrics)
  bool progress_thread = true;  // the run's progress (the busy rows are measured with it)
  // The blocking collectives the deck's schedules wait for (their exposed calls): timed at
  // these sizes, at most 6 sizes per op, group and scope (the model interpolates between).
  std::vector<CommCall> exposed;
  // The collectives they post non-blocking beside compute (overlapped all-gathers and
  // reduce-scatters): timed so, at these sizes, the same way (`posted` rows).
  std::vector<CommCall> posted;
};

// Measures the plan on every rank of comm's world at once (collective): GEMMs at the layer's
// shapes, the element-wise kernels, attention tiles (fitted from whole calls), the links from
// rank 0 to its nearest peer and to one on another node, alone and beside GEMMs. Rank 0's table is returned on rank 0
// (the ranks' rates agree within the machine's noise; rank 0 stands for all).
Calibration measure_calibration(const CalibrationPlan& plan, comm::Communicator& comm, bool verbose);

// The GEMMs of one layer at N rows (layer_ops), each timed in its own loop as the gemm rows
// are, now: seconds per layer forward and (backward true) backward, rank 0's on every rank.
// Collective over comm's world.
std::pair<double, double> layer_gemm_seconds(const model::Shape& s, int64_t N, const std::string& dtype, bool backward,
                                             comm::Communicator& comm);

}  // namespace minicp::predict
