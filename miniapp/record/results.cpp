// The results file (see results.hpp).
#include "miniapp/record/results.hpp"

#include <cstddef>
#include <cstring>
#include <stdexcept>

#include "harness/main.hpp"
#include "miniapp/record/h5.hpp"

namespace minicp::record {
namespace {

void write_attrs(H5File& f, const std::string& object, const Attrs& a) {
  for (const auto& [k, v] : a.text) f.set_attr(object, k, v);
  for (const auto& [k, v] : a.integer) f.set_attr(object, k, v);
  for (const auto& [k, v] : a.real) f.set_attr(object, k, v);
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + v[i];
  return s;
}

// Rank 0's attributes on every rank: HDF5 metadata (groups, attributes) must be written by
// every rank with the same values, and some (the figures of merit, the start time) are known
// on rank 0 only.
Attrs bcast(const Attrs& a, MPI_Comm comm) {
  std::string buf;
  auto put = [&](const std::string& x) {
    const int64_t n = int64_t(x.size());
    buf.append(reinterpret_cast<const char*>(&n), sizeof n);
    buf += x;
  };
  for (const auto& [k, v] : a.text) put("t" + k), put(v);
  for (const auto& [k, v] : a.integer) put("i" + k), put(std::string(reinterpret_cast<const char*>(&v), sizeof v));
  for (const auto& [k, v] : a.real) put("r" + k), put(std::string(reinterpret_cast<const char*>(&v), sizeof v));
  buf = harness::bcast_string(buf, comm);
  Attrs out;
  size_t p = 0;
  auto get = [&] {
    int64_t n = 0;
    std::memcpy(&n, buf.data() + p, sizeof n);
    p += sizeof n;
    std::string x = buf.substr(p, size_t(n));
    p += size_t(n);
    return x;
  };
  while (p < buf.size()) {
    const std::string key = get(), val = get();
    if (key[0] == 't') out.text[key.substr(1)] = val;
    if (key[0] == 'i') std::memcpy(&out.integer[key.substr(1)], val.data(), sizeof(int64_t));
    if (key[0] == 'r') std::memcpy(&out.real[key.substr(1)], val.data(), sizeof(double));
  }
  return out;
}

}  // namespace

std::string not_a_results_file(const std::string& path) { return kind_mismatch(path, kResultsKind); }

std::vector<StoredCase> stored_cases(const std::string& path) {
  std::vector<StoredCase> out;
  for (const std::string& id : groups_with_attr(path, "/cases", "complete", "yes")) {
    const std::string g = "/cases/" + id;
    out.push_back({id, read_string_attr(path, g, "scheme"), read_string_attr(path, g, "pass"),
                   read_string_attr(path, g, "documents_label"), int64_t(read_number_attr(path, g, "seq_len")),
                   int64_t(read_number_attr(path, g, "decode_tokens")),
                   read_number_attr(path, g + "/summary", "measured_time_s")});
  }
  return out;
}

std::vector<std::string> complete_cases(const std::string& file, MPI_Comm comm, std::string* deck) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string all, err, d;
  if (rank == 0) {
    try {
      for (const std::string& id : groups_with_attr(file, "/cases", "complete", "yes")) all += id + "\n";
      d = read_string_attr(file, "/", "deck");
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  err = harness::bcast_string(err, comm);
  if (!err.empty()) throw std::runtime_error(err);
  all = harness::bcast_string(all, comm);
  if (deck) *deck = harness::bcast_string(d, comm);
  std::vector<std::string> ids;
  size_t p = 0;
  while (p < all.size()) {
    const size_t q = all.find('\n', p);
    ids.push_back(all.substr(p, q - p));
    p = q + 1;
  }
  return ids;
}

Results::Results(std::string path, MPI_Comm comm, const Attrs& root, const std::string& resume_from,
                 const std::string& resolved_deck)
    : path_(std::move(path)), comm_(comm), root_(bcast(root, comm)) {
  std::string start = resume_from;
  if (!resume_from.empty()) {
    std::string deck;
    done_ = complete_cases(resume_from, comm_, &deck);
    if (deck != resolved_deck)
      throw std::runtime_error("--resume " + resume_from +
                               ": the file was written by another deck (its resolved deck differs from this run's)");
  }
  H5File f(path_, comm_, start);
  write_attrs(f, "/", root_);
  f.set_attr("/", "file_kind", kResultsKind);
  f.set_attr("/", "complete", "no");
  f.create_group("/cases");
  f.commit();
  exists_ = true;
}

bool Results::has_case(const std::string& id) const {
  for (const auto& d : done_)
    if (d == id) return true;
  return false;
}

double Results::add_case(const CaseRecord& c) {
  const double t0 = MPI_Wtime();
  H5File f(path_, comm_, path_);
  const std::string g = "/cases/" + c.id;
  f.create_group(g);
  write_attrs(f, g, bcast(c.attrs, comm_));
  if (!c.document_lengths.empty())  // every rank holds them; rank 0's are written
    f.write_replicated(g + "/documents", int64_t(c.document_lengths.size()), 0, c.document_lengths.data());
  f.create_group(g + "/summary");
  write_attrs(f, g + "/summary", bcast(c.summary, comm_));
  f.write_table(g + "/timing",
                {{"mode", Column::I32, offsetof(TimingRow, mode)},
                 {"rep", Column::I32, offsetof(TimingRow, rep)},
                 {"rank", Column::I32, offsetof(TimingRow, rank)},
                 {"layer", Column::I32, offsetof(TimingRow, layer)},
                 {"pass", Column::I32, offsetof(TimingRow, pass)},
                 {"phase", Column::I32, offsetof(TimingRow, phase)},
                 {"seconds", Column::F64, offsetof(TimingRow, seconds)}},
                sizeof(TimingRow), c.timing.data(), int64_t(c.timing.size()));
  f.set_attr(g + "/timing", "mode_names", join(c.mode_names));
  f.set_attr(g + "/timing", "phase_names", join(c.phase_names));
  f.set_attr(g + "/timing", "pass_names", "forward,backward");
  f.set_attr(g + "/timing", "units", "seconds: s");
  f.write_table(g + "/steps",
                {{"mode", Column::I32, offsetof(StepRow, mode)},
                 {"rep", Column::I32, offsetof(StepRow, rep)},
                 {"rank", Column::I32, offsetof(StepRow, rank)},
                 {"forward_s", Column::F64, offsetof(StepRow, forward_s)},
                 {"backward_s", Column::F64, offsetof(StepRow, backward_s)},
                 {"step_s", Column::F64, offsetof(StepRow, step_s)},
                 {"phases_s", Column::F64, offsetof(StepRow, phases_s)},
                 {"attn_s", Column::F64, offsetof(StepRow, attn_s)},
                 {"attn_comm_wait_s", Column::F64, offsetof(StepRow, attn_comm_wait_s)},
                 {"grad_allreduce_s", Column::F64, offsetof(StepRow, grad_allreduce_s)},
                 {"grad_allreduce_busy_s", Column::F64, offsetof(StepRow, grad_allreduce_busy_s)},
                 {"tp_comm_s", Column::F64, offsetof(StepRow, tp_comm_s)}},
                sizeof(StepRow), c.steps.data(), int64_t(c.steps.size()));
  f.set_attr(g + "/steps", "mode_names", join(c.mode_names));
  f.set_attr(g + "/steps", "units", "*_s: s");
  f.write_table(g + "/memory",
                {{"rank", Column::I32, offsetof(MemoryRow, rank)},
                 {"kokkos_peak_bytes", Column::I64, offsetof(MemoryRow, kokkos_peak_bytes)},
                 {"space_peak_bytes", Column::I64, offsetof(MemoryRow, space_peak_bytes)},
                 {"rss_peak_bytes", Column::I64, offsetof(MemoryRow, rss_peak_bytes)},
                 {"predicted_bytes", Column::I64, offsetof(MemoryRow, predicted_bytes)}},
                sizeof(MemoryRow), c.memory.data(), int64_t(c.memory.size()));
  f.set_attr(g + "/memory", "units", "bytes");
  f.write_table(g + "/events",
                {{"rank", Column::I32, offsetof(EventRow, rank)},
                 {"rep", Column::I32, offsetof(EventRow, rep)},
                 {"mode", Column::I32, offsetof(EventRow, mode)},
                 {"layer", Column::I32, offsetof(EventRow, layer)},
                 {"pass", Column::I32, offsetof(EventRow, pass)},
                 {"step", Column::I32, offsetof(EventRow, step)},
                 {"kind", Column::I32, offsetof(EventRow, kind)},
                 {"peer", Column::I32, offsetof(EventRow, peer)},
                 {"group", Column::I32, offsetof(EventRow, group)},
                 {"label", Column::I32, offsetof(EventRow, label)},
                 {"bytes", Column::I64, offsetof(EventRow, bytes)},
                 {"flops", Column::F64, offsetof(EventRow, flops)},
                 {"t_begin", Column::F64, offsetof(EventRow, t_begin)},
                 {"t_end", Column::F64, offsetof(EventRow, t_end)}},
                sizeof(EventRow), c.events.data(), int64_t(c.events.size()));
  f.set_attr(g + "/events", "kind_names", join(c.kind_names));
  f.set_attr(g + "/events", "mode_names", join(c.mode_names));
  f.set_attr(g + "/events", "label_names", join(c.phase_names));
  f.set_attr(g + "/events", "units", "bytes: B, flops: FLOP, t_begin/t_end: s on rank 0's clock (aligned)");
  f.set_attr(g, "complete", "yes");  // last: a case is complete only once all of it is written
  f.commit();
  return MPI_Wtime() - t0;
}

void Results::finish(const Attrs& root_end) {
  H5File f(path_, comm_, path_);
  write_attrs(f, "/", bcast(root_end, comm_));
  f.set_attr("/", "complete", "yes");
  f.commit();
}

}  // namespace minicp::record
