// The figures of merit of a case (docs/figures-of-merit.md), computed on the group's rank 0
// from the raw step rows measure.hpp gathered, and the range check every figure goes
// through: a figure outside its range is a defect of the measurement, so it is flagged
// (out_of_range, figures_in_range = 0, a warning) rather than reported as a result.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "miniapp/record/results.hpp"
#include "miniapp/run/measure.hpp"

namespace minicp::run {

// measured_time_s of `none` per none_key in this sweep (the CP efficiency's base).
using NoneTimes = std::map<std::string, double>;
// The problem a `none` case is the reference of: "<pass>_<seq_len>", for decode
// "_T<decode_tokens>" (a decode problem is its cache and its new tokens), and with packed
// documents "_docs<label>" (documents_label: another packing is another problem).
std::string none_key(const std::string& pass, int64_t seq_len, int64_t decode_tokens, const std::string& documents);
std::string none_key(const Case& c);

// Every figure (NaN where not measured; a *_note text says why an overlap that could have
// been measured was not resolved), the message sizes (message_sizes), then check_ranges.
record::Attrs figures(const Case& c, const CaseResult& m, const NoneTimes& none, int threads);

// The bytes per value of each kind of message of case c in a run of elem-byte stored values
// (block_, partial_, dkv_, grad_allreduce_bytes_per_value).
void message_sizes(record::Attrs& s, const Case& c, size_t elem);

// A figure with a range: outside [lo, hi] it is a defect of the measurement, for the reason
// below or above names (docs/figures-of-merit.md).
struct FigureRange {
  const char* name;
  double lo, hi;
  const char *below, *above;
};
const std::vector<FigureRange>& figure_ranges();

// One figure of a case's summary (/cases/<id>/summary): its name (`<phase>` stands for each
// phase of the timing table), its unit ("s", "FLOP/s", "tokens/s", "B", "B/value", "1": a
// dimensionless number, "flag": 0 or 1, "text"), and what it is, in one line (in full:
// docs/figures-of-merit.md). Every summary attribute a run writes matches one entry
// (tests/check_results.py holds the files to it).
struct FigureInfo {
  const char* name;
  const char* unit;
  const char* definition;
  bool required;  // every case a run writes holds it (the others: only where they apply)
};
const std::vector<FigureInfo>& figure_catalog();
// The catalog as JSON, each entry with its range ([lo, hi], hi null where unbounded; null
// without one) and `required`: `minicp --list-figures --json` and the results file's figure_catalog
// attribute, which tests/check_results.py and the analysis package read.
std::string figure_catalog_json(int indent = -1);
// The same as text, one figure a line: name [unit] in [lo, hi]: definition.
std::string figure_catalog_text();

// Checks every figure that has a range (NaN passes) and sets `out_of_range` ("" or
// "name=value (allowed [lo, hi]: why); ...") and `figures_in_range` (1 or 0). Returns the text.
std::string check_ranges(record::Attrs& summary);

}  // namespace minicp::run
