// The results file of a minicp run (--out FILE.h5): everything measured, every case, every
// rank, through record::H5File. Layout and units: docs/results-file.md.
//   /                      attributes: version, build, platform, run (deck text, command line)
//   /cases/<id>/           attributes: the case (scheme, settings, shape, pass, mask, status)
//   /cases/<id>/timing     table: mode, rep, rank, layer, pass, phase, seconds
//   /cases/<id>/steps      table: mode, rep, rank, forward_s, backward_s, step_s, phases_s,
//                          attn_s, attn_comm_wait_s, grad_allreduce_s (every rep, every rank)
//   /cases/<id>/memory     table: rank, kokkos_peak_bytes, space_peak_bytes, rss_peak_bytes, predicted_bytes
//   /cases/<id>/events     table: rank, rep, mode, layer, pass, step, kind, peer, group,
//                          label, bytes, flops, t_begin, t_end (seconds on rank 0's clock)
//   /cases/<id>/summary    attributes: the figures of merit (units in the names)
// The file grows one case at a time, each a transaction (copy, add the case, rename into
// place), so a run stopped between cases leaves a valid file of the cases done; --resume
// starts from such a file and runs only the cases it lacks.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace minicp::record {

// Attributes of one object.
struct Attrs {
  std::map<std::string, std::string> text;
  std::map<std::string, int64_t> integer;
  std::map<std::string, double> real;
};

// Rows of the per-rank tables (this rank's).
struct TimingRow {
  int32_t mode, rep, rank, layer, pass, phase;  // pass: 0 forward, 1 backward
  double seconds;
};
// One rank's step of one rep in one mode: the raw times every step figure is computed from.
struct StepRow {
  int32_t mode, rep, rank;
  double forward_s, backward_s, step_s;  // this rank's, fenced: step_s = forward_s + backward_s
  double phases_s;                       // the sum of its phases over layers and passes (timing table)
  double attn_s;                         // attention phases (attn_compute + attn_comm), all layers
  double attn_comm_wait_s;               // blocked in the scheme's waits (event-based exposed comm)
  double grad_allreduce_s;               // posting the dW all-reduces and waiting for them (exposed)
  double grad_allreduce_busy_s;          // the collective thread running them (NaN: none ran them)
  double tp_comm_s;                      // posting and waiting for the TP collectives (exposed)
};
struct MemoryRow {
  int32_t rank;
  int64_t kokkos_peak_bytes;                // every Kokkos memory space
  int64_t space_peak_bytes;                 // the tensors' space alone (the device's in a CUDA build)
  int64_t rss_peak_bytes, predicted_bytes;  // -1: not measured (see measured_*)
};
struct EventRow {
  int32_t rank, rep, mode, layer, pass, step, kind, peer, group, label;
  int64_t bytes;
  double flops, t_begin, t_end;
};

struct CaseRecord {
  std::string id;
  Attrs attrs, summary;
  std::vector<TimingRow> timing;
  std::vector<StepRow> steps;
  std::vector<MemoryRow> memory;
  std::vector<EventRow> events;
  std::vector<int64_t> document_lengths;  // the case's packed documents, in order (none: empty)
  // Names of the enumerations the tables use (recorded as attributes of the tables).
  std::vector<std::string> mode_names, phase_names, kind_names;
};

class Results {
 public:
  // path: the results file; comm: every rank of the job (all take part in every write).
  // resume_from: "" or an existing results file of the same resolved deck, whose complete
  // cases are kept (checked: throws std::runtime_error when the deck differs).
  Results(std::string path, MPI_Comm comm, const Attrs& root, const std::string& resume_from,
          const std::string& resolved_deck);
  // Ids of the complete cases already in the file (from resume_from).
  const std::vector<std::string>& done() const { return done_; }
  bool has_case(const std::string& id) const;
  // Adds one case as a transaction. Collective. Returns the seconds it took.
  double add_case(const CaseRecord& c);
  // Marks the file complete and sets the end-of-run attributes. Collective.
  void finish(const Attrs& root_end);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  MPI_Comm comm_;
  std::vector<std::string> done_;
  bool exists_ = false;  // the file at path_ is ours (written by this run or resumed)
  Attrs root_;
};

// The root attribute file_kind of a results file: what tells it from any other file.
constexpr const char* kResultsKind = "minicp results";

// "" when the existing file at path is a minicp results file, else what it is instead (see
// record::kind_mismatch). Serial.
std::string not_a_results_file(const std::string& path);

// A complete case of an existing results file, as --resume needs it. Serial (one rank).
struct StoredCase {
  std::string id, scheme, pass, documents_label;
  int64_t seq_len = 0, decode_tokens = 0;
  double measured_time_s = 0;  // its summary's (NaN when absent: a refused case)
};
std::vector<StoredCase> stored_cases(const std::string& path);

// Ids of the complete cases (status "ok" or "refused: ...") of an existing results file,
// and its resolved deck (rank 0 reads; every rank gets the answer). Collective.
std::vector<std::string> complete_cases(const std::string& file, MPI_Comm comm, std::string* deck);

}  // namespace minicp::record
