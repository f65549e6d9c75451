#include "miniapp/run/documents.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "harness/input.hpp"
#include "harness/main.hpp"
#include "harness/output.hpp"
#include "harness/toml.hpp"

namespace minicp::run {

using harness::TomlNode;
using harness::UsageError;

namespace {

constexpr size_t kMaxDocuments = size_t(1) << 24;  // a mix's documents in one sequence

// splitmix64: the same lengths on every rank, compiler and standard library.
struct Draw {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double unit() { return double(next() >> 11) * 0x1.0p-53; }                                        // [0, 1)
  int64_t between(int64_t lo, int64_t hi) { return lo + int64_t(next() % uint64_t(hi - lo + 1)); }  // [lo, hi]
};

// A file's bytes, checked first (harness/input.hpp: no FIFO or device, no file over the kind's
// size); a problem names `what`.
std::string read_text(const std::string& path, const std::string& what, const harness::InputKind& kind) {
  if (const std::string why = harness::input_file_problem(path, kind); !why.empty())
    throw UsageError(what + ": " + why);
  try {
    return harness::read_input_file(path, kind);
  } catch (const std::runtime_error& e) {
    throw UsageError(what + ": " + e.what());
  }
}

// The lengths of a file: one whole number >= 1 a line; blank lines and '#' comments skipped.
std::vector<int64_t> file_lengths(const std::string& path, const std::string& what) {
  std::istringstream in(read_text(path, what, harness::kLengthsFile));
  std::vector<int64_t> out;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    line = line.substr(0, line.find('#'));
    const size_t a = line.find_first_not_of(" \t\r"), b = line.find_last_not_of(" \t\r");
    if (a == std::string::npos) continue;
    const std::string word = line.substr(a, b - a + 1);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(word.c_str(), &end, 10);
    if (*end != '\0' || errno != 0 || v < 1 || word.find_first_not_of("0123456789") != std::string::npos)
      throw UsageError(what + " line " + std::to_string(line_no) + ": '" + harness::printable(word) +
                       "' is not a length (a whole number of tokens >= 1, one a line)");
    out.push_back(v);
  }
  return out;
}

// The lengths of an array written in the deck ("[1, 37, 900]").
std::vector<int64_t> list_lengths(const std::string& item, const std::string& what) {
  TomlNode t;
  try {
    t = harness::parse_toml("v = " + item);
  } catch (const harness::TomlError&) {
    throw UsageError(what + ": not an array of lengths");
  }
  const TomlNode* v = t.get("v");
  if (!v || v->type != TomlNode::Type::Array || v->array.empty()) throw UsageError(what + ": not an array of lengths");
  std::vector<int64_t> out;
  for (const TomlNode& e : v->array) {
    if (e.type != TomlNode::Type::Integer || e.integer < 1)
      throw UsageError(what + ": each length must be a whole number of tokens >= 1");
    out.push_back(e.integer);
  }
  return out;
}

// Lengths cut to S: the documents past S dropped, the one across S cut.
std::vector<int64_t> cut_at(std::vector<int64_t> lengths, int64_t S, const std::string& what) {
  int64_t at = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] >= S - at) {
      lengths[i] = S - at;
      lengths.resize(i + 1);
      return lengths;
    }
    at += lengths[i];
  }
  throw UsageError(what + ": the lengths sum to " + std::to_string(at) + " tokens, short of seq_len " +
                   std::to_string(S));
}

std::vector<int64_t> mix_lengths(const Mix& m, int64_t S, uint64_t seed) {
  Draw g{seed ^ 0x6d696e6963702d64ull};  // "minicp-d": the documents' own stream of the seed
  double total = 0;
  for (double w : m.weights) total += w;
  std::vector<int64_t> out;
  int64_t at = 0;
  if (m.first_share > 0)
    out.push_back(std::max<int64_t>(1, int64_t(std::llround(m.first_share * double(S))))), at = out.back();
  while (at < S) {
    if (out.size() >= kMaxDocuments)
      throw UsageError("mix " + m.name + " at seq_len " + std::to_string(S) + ": more than " +
                       std::to_string(kMaxDocuments) + " documents");
    double x = g.unit() * total;
    size_t b = 0;
    while (b + 1 < m.bins.size() && x >= m.weights[b]) x -= m.weights[b], ++b;
    const int64_t len = std::min(g.between(m.bins[b].first, m.bins[b].second), S - at);
    out.push_back(len), at += len;
  }
  return out;
}

bool is_path(const std::string& item) {
  return item.find('/') != std::string::npos || item.find('.') != std::string::npos;
}

double read_share(const TomlNode& t, const std::string& file) {
  const TomlNode* s = t.get("first_share");
  if (!s) return 0;
  const double v = s->type == TomlNode::Type::Float     ? s->number
                   : s->type == TomlNode::Type::Integer ? double(s->integer)
                                                        : -1;
  if (!(v >= 0 && v < 1)) throw UsageError(file + ": first_share: a number from 0 to below 1");
  return v;
}

void read_bins(const TomlNode& t, const std::string& file, Mix& m) {
  const TomlNode* bins = t.get("bins");
  const TomlNode* weights = t.get("weights");
  if (!bins || bins->type != TomlNode::Type::Array || bins->array.empty())
    throw UsageError(file + ": bins: an array of [shortest, longest] pairs is required");
  if (!weights || weights->type != TomlNode::Type::Array || weights->array.size() != bins->array.size())
    throw UsageError(file + ": weights: one number > 0 for each bin is required");
  for (size_t i = 0; i < bins->array.size(); ++i) {
    const TomlNode& b = bins->array[i];
    const TomlNode& w = weights->array[i];
    if (b.type != TomlNode::Type::Array || b.array.size() != 2 || b.array[0].type != TomlNode::Type::Integer ||
        b.array[1].type != TomlNode::Type::Integer || b.array[0].integer < 1 || b.array[1].integer < b.array[0].integer)
      throw UsageError(file + ": bins[" + std::to_string(i) + "]: [shortest, longest] with 1 <= shortest <= longest");
    const double wv = w.type == TomlNode::Type::Float     ? w.number
                      : w.type == TomlNode::Type::Integer ? double(w.integer)
                                                          : 0;
    if (!(wv > 0 && std::isfinite(wv))) throw UsageError(file + ": weights[" + std::to_string(i) + "]: a number > 0");
    m.bins.push_back({b.array[0].integer, b.array[1].integer});
    m.weights.push_back(wv);
  }
}

}  // namespace

std::string documents_dir() { return harness::inputs_dir("MINICP_DOCUMENTS", "documents"); }

std::vector<std::string> mix_names() { return harness::toml_names(documents_dir()); }

Mix read_mix(const std::string& name) {
  const std::vector<std::string> names = mix_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    std::string all;
    for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
    throw UsageError("mix \"" + harness::printable(name) + "\": not one of " + (all.empty() ? "(none)" : all) +
                     " (in " + documents_dir() + ")");
  }
  Mix m;
  m.name = name, m.path = documents_dir() + "/" + name + ".toml";
  TomlNode t;
  try {
    t = harness::parse_toml(read_text(m.path, m.path, harness::kMixFile), m.path);
  } catch (const harness::TomlError& e) {
    throw UsageError(m.path + ":" + std::to_string(e.line) + ": " + e.what());
  }
  const TomlNode* help = t.get("help");
  if (!help || help->type != TomlNode::Type::String) throw UsageError(m.path + ": help: a string is required");
  m.help = help->string;
  m.first_share = read_share(t, m.path);
  read_bins(t, m.path, m);
  return m;
}

std::string mixes_text() {
  std::string out = "Document mixes (sweep.documents; " + documents_dir() + "):\n";
  for (const std::string& n : mix_names()) {
    const Mix m = read_mix(n);
    out += "  " + n + std::string(n.size() < 14 ? 14 - n.size() : 1, ' ') + m.help + "\n";
  }
  return out;
}

std::string mixes_json(int indent) {
  harness::Json all = harness::Json::array();
  for (const std::string& n : mix_names()) {
    const Mix m = read_mix(n);
    harness::Json bins = harness::Json::array();
    for (size_t i = 0; i < m.bins.size(); ++i)
      bins.push_back({{"shortest", m.bins[i].first}, {"longest", m.bins[i].second}, {"weight", m.weights[i]}});
    all.push_back({{"name", n}, {"help", m.help}, {"first_share", m.first_share}, {"bins", bins}});
  }
  return all.dump(indent);
}

std::vector<int64_t> document_lengths(const std::string& item, int64_t S, uint64_t seed, const std::string& key) {
  const std::string what = key + " \"" + harness::printable(item) + "\"";
  if (!item.empty() && item[0] == '[') return cut_at(list_lengths(item, what), S, what);
  if (is_path(item)) return cut_at(file_lengths(item, what), S, what);
  try {
    return mix_lengths(read_mix(item), S, seed);
  } catch (const UsageError& e) {
    throw UsageError(key + ": " + e.what());
  }
}

std::string documents_label(const std::string& item, size_t index) {
  if (!item.empty() && item[0] == '[') return "list" + std::to_string(index);
  std::string stem = item;
  if (is_path(item)) {
    stem = item.substr(item.find_last_of('/') == std::string::npos ? 0 : item.find_last_of('/') + 1);
    stem = stem.substr(0, stem.find('.'));
  }
  for (char& ch : stem)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_') ch = '-';
  return stem.empty() ? "file" + std::to_string(index) : stem;
}

}  // namespace minicp::run
