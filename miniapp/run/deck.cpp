// Deck reading and validation (TOML through harness/toml.hpp), and the sweep's cases. Each key is a row of
// deck_keys() (deck_keys.cpp); the checks between keys follow the table's reading in load_deck.
#include "miniapp/run/deck.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <variant>

#include "harness/input.hpp"
#include "harness/main.hpp"
#include "harness/output.hpp"
#include "harness/toml.hpp"
#include "kernels/attention.hpp"
#include "miniapp/cp/dispatch.hpp"
#include "miniapp/run/documents.hpp"

namespace minicp::run {
namespace {

using harness::TomlError;
using harness::TomlNode;
using harness::UsageError;

std::string join(const std::vector<std::string>& v, const std::string& sep = ", ") {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// The sections in table order, each with its keys.
const std::vector<std::pair<std::string, std::vector<std::string>>>& section_keys() {
  static const auto keys = [] {
    std::vector<std::pair<std::string, std::vector<std::string>>> out;
    for (const DeckKey& k : deck_keys()) {
      if (out.empty() || out.back().first != k.section) out.push_back({k.section, {}});
      out.back().second.push_back(k.name);
    }
    return out;
  }();
  return keys;
}

// "" when section.key is a deck key, else the message naming it and what is allowed.
std::string unknown_key(const std::string& section, const std::string& key) {
  std::vector<std::string> sections;
  for (const auto& [s, keys] : section_keys()) {
    sections.push_back(s);
    if (s != section) continue;
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) return "";
    return "unknown key " + section + "." + key + " (allowed in [" + section + "]: " + join(keys) + ")";
  }
  return "unknown section [" + section + "] (allowed: " + join(sections) + ")";
}

// `<text>`: a value in TOML syntax (throws harness::TomlError).
TomlNode parse_value(const std::string& text) { return *harness::parse_toml("v = " + text).get("v"); }

// A listed value as a message shows it (a string in quotes).
std::string shown(int64_t v) { return std::to_string(v); }
std::string shown(const std::string& v) { return "\"" + v + "\""; }

// Reads each key of the table, typed and checked; messages name section.key.
class Reader {
 public:
  // too_big: "section.key" -> the text of a --set value that holds an integer beyond 64 bits
  // (TOML cannot hold it, so apply_set kept it as a string; it is reported as out of range).
  Reader(const TomlNode& t, std::map<std::string, std::string> too_big) : t_(t), too_big_(std::move(too_big)) {}
  bool has(const std::string& s, const std::string& k) const { return node(s, k) != nullptr; }

  // Sets k's value in d: the deck's, else k's default. A key with neither is left to the
  // checks after the table.
  void read(const DeckKey& k, Deck& d) const {
    if (const TomlNode* n = node(k.section, k.name)) return k.set(d, value(k, *n));
    if (k.default_toml.empty()) return;
    k.set(d, value(k, parse_value(k.default_toml)));
  }

 private:
  const TomlNode* node(const std::string& s, const std::string& k) const {
    const TomlNode* sec = t_.get(s);
    return sec ? sec->get(k) : nullptr;
  }
  KeyValue value(const DeckKey& k, const TomlNode& n) const {
    const std::string key = k.id();
    auto one_int = [&](const TomlNode& e) { return check_int(key, e, k.min, k.max); };
    auto one_choice = [&](const TomlNode& e) { return check_choice(key, e, k.choices); };
    switch (k.type) {
      case KeyType::Integer: return one_int(n);
      case KeyType::Number: return check_number(key, n, k.above);
      case KeyType::Choice: return one_choice(n);
      case KeyType::Text: return check_choice(key, n, {});
      case KeyType::Integers: return once(key, list(key, n, one_int));
      case KeyType::Choices: return once(key, list(key, n, one_choice));
      case KeyType::Documents: return documents(key, n);
    }
    return {};
  }
  // One value or an array of them, each read by `each`.
  template <class Each, class T = std::invoke_result_t<Each, const TomlNode&>>
  static std::vector<T> list(const std::string& key, const TomlNode& n, Each each) {
    if (n.type != TomlNode::Type::Array) return {each(n)};
    std::vector<T> out;
    if (n.array.empty()) throw UsageError(key + ": the array is empty (give at least one value)");
    for (const TomlNode& e : n.array) out.push_back(each(e));
    return out;
  }
  // sweep.documents: [] or one item or a list; an item is a string, or an array of lengths
  // (each read as its TOML text, which document_lengths reads back).
  static std::vector<std::string> documents(const std::string& key, const TomlNode& n) {
    auto item = [&](const TomlNode& e) -> std::string {
      if (e.type == TomlNode::Type::String && !e.string.empty()) return e.string;
      if (e.type == TomlNode::Type::Array) return harness::format_toml(e);
      throw UsageError(key + ": expected a mix's name, a file of lengths or an array of lengths, got " + e.type_name());
    };
    if (n.type == TomlNode::Type::Array && n.array.empty()) return {};
    // One array of integers alone is one list of lengths, not a list of items.
    if (n.type == TomlNode::Type::Array && n.array.front().type == TomlNode::Type::Integer) return {item(n)};
    return once(key, list(key, n, item));
  }
  // Each value once: a value listed twice would run its cases twice.
  template <class T>
  static std::vector<T> once(const std::string& key, std::vector<T> v) {
    for (auto i = v.begin(); i != v.end(); ++i)
      if (std::find(v.begin(), i, *i) != i) throw UsageError(key + ": " + shown(*i) + " is listed twice");
    return v;
  }
  int64_t check_int(const std::string& key, const TomlNode& n, int64_t lo, int64_t hi) const {
    const auto big = too_big_.find(key);
    if (big != too_big_.end())
      throw UsageError(key + " = " + big->second + ": integer out of range: must be between " + std::to_string(lo) +
                       " and " + std::to_string(hi));
    if (n.type != TomlNode::Type::Integer) throw UsageError(key + ": expected an integer, got " + n.type_name());
    const int64_t v = n.integer;
    if (v < lo || v > hi) {
      const std::string allowed =
          hi == INT64_MAX ? ">= " + std::to_string(lo) : "between " + std::to_string(lo) + " and " + std::to_string(hi);
      throw UsageError(key + " = " + std::to_string(v) + ": must be " + allowed);
    }
    return v;
  }
  static double check_number(const std::string& key, const TomlNode& n, double above) {
    double v = 0;
    if (n.type == TomlNode::Type::Integer)
      v = double(n.integer);
    else if (n.type == TomlNode::Type::Float)
      v = n.number;
    else
      throw UsageError(key + ": expected a number, got " + n.type_name());
    if (!std::isfinite(v) || !(v > above))
      throw UsageError(key + " = " + num(v) + ": must be a finite number > " + num(above));
    return v;
  }
  // A string, one of allowed (empty allowed: any).
  static std::string check_choice(const std::string& key, const TomlNode& n, const std::vector<std::string>& allowed) {
    if (n.type != TomlNode::Type::String) throw UsageError(key + ": expected a string, got " + n.type_name());
    const std::string& v = n.string;
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), v) == allowed.end())
      throw UsageError(key + " = \"" + v + "\": not one of " + join(allowed));
    return v;
  }
  const TomlNode& t_;
  std::map<std::string, std::string> too_big_;
};

// The deck's text as TOML; `origin` names it in a message ("--deck d.toml").
TomlNode parse_deck(const std::string& text, const std::string& origin) {
  try {
    return harness::parse_toml(text, origin);
  } catch (const TomlError& e) {
    throw UsageError(origin + ":" + std::to_string(e.line) + ":" + std::to_string(e.column) +
                     ": malformed TOML: " + e.what());
  }
}

TomlNode read_file(const std::string& path) {
  std::string text;
  try {
    text = harness::read_input_file(path, harness::kDeckFile);
  } catch (const std::runtime_error& e) {
    throw UsageError(std::string("--deck ") + e.what());
  }
  return parse_deck(text, "--deck " + path);
}

// Whether a --set value that TOML refused is integers only (one, or an array of them): then an
// integer is beyond 64 bits, and the value is out of range rather than a word. "1 2" is not:
// two integers without an array are a malformed value.
bool integer_text(const std::string& v) {
  static const std::regex integers(
      R"(\s*([+-]?[0-9][0-9_]*|\[\s*[+-]?[0-9][0-9_]*(\s*,\s*[+-]?[0-9][0-9_]*)*\s*,?\s*\])\s*)");
  return std::regex_match(v, integers);
}

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

const DeckKey& key_of(const std::string& id) {
  for (const DeckKey& k : deck_keys())
    if (k.id() == id) return k;
  throw std::logic_error("no deck key " + id);
}

// What a key of this type is written as, for the message on a value that is not TOML.
std::string written_as(const DeckKey& k) {
  switch (k.type) {
    case KeyType::Integer: return "an integer (e.g. " + k.id() + "=5)";
    case KeyType::Number: return "a number (e.g. " + k.id() + "=2.5)";
    case KeyType::Integers: return "an integer or an array of them (e.g. " + k.id() + "=[64, 128])";
    default: return "a string";
  }
}

}  // namespace

SetOverride parse_set(const std::string& set) {
  const std::string form = "expected section.key=value (e.g. --set run.reps=5)";
  if (set.find_first_of("\n\r") != std::string::npos)
    throw UsageError("--set " + set + ": holds a line break; give one key=value per --set");
  const size_t eq = set.find('=');
  const size_t dot = set.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) throw UsageError("--set " + set + ": " + form);
  SetOverride o{trimmed(set.substr(0, dot)), trimmed(set.substr(dot + 1, eq - dot - 1)), trimmed(set.substr(eq + 1))};
  if (o.section.empty() || o.key.empty()) throw UsageError("--set " + set + ": " + form);
  const std::string bad = unknown_key(o.section, o.key);
  if (!bad.empty()) throw UsageError("--set " + set + ": " + bad);
  return o;
}

namespace {

// "section.key=value": value as TOML (for a string key, a bare word that is not TOML is taken as
// the string). too_big gets "section.key" -> value when the value is an integer TOML cannot hold.
void apply_set(TomlNode& t, const std::string& set, std::map<std::string, std::string>& too_big) {
  const SetOverride o = parse_set(set);
  const DeckKey& k = key_of(o.id());
  TomlNode parsed;
  try {
    parsed = parse_value(o.value);
  } catch (const TomlError&) {
    const bool numeric = k.type == KeyType::Integer || k.type == KeyType::Number || k.type == KeyType::Integers;
    if (numeric && !integer_text(o.value))
      throw UsageError("--set " + set + ": " + o.value + " is not a TOML value; " + o.id() + " takes " + written_as(k));
    parsed = TomlNode::of(o.value);
    if (integer_text(o.value)) too_big[o.id()] = o.value;
  }
  if (!t.get(o.section)) t.set(o.section, TomlNode{});
  TomlNode* sec = t.get(o.section);
  if (!sec->is_table()) throw UsageError("--set " + set + ": [" + o.section + "] in the deck is not a table");
  sec->set(o.key, std::move(parsed));
}

// Each key once: a second --set of one key would silently win over the first.
void check_sets_once(const std::vector<std::string>& sets) {
  std::map<std::string, std::string> seen;
  for (const std::string& s : sets) {
    const SetOverride o = parse_set(s);
    const auto [at, fresh] = seen.emplace(o.id(), s);
    if (!fresh)
      throw UsageError("--set " + s + ": " + o.id() + " is set twice (also --set " + at->second +
                       "); give each key once");
  }
}

// origin names the deck in a message ("--deck d.toml").
void check_keys(const TomlNode& t, const std::string& origin) {
  for (const auto& [s, sec] : t.table) {
    const std::string bad = unknown_key(s, "");
    if (bad.rfind("unknown section", 0) == 0) throw UsageError(origin + ": " + bad);
    if (!sec.is_table()) throw UsageError(origin + ": " + s + " must be a table ([" + s + "])");
    for (const auto& kv : sec.table) {
      const std::string why = unknown_key(s, kv.first);
      if (!why.empty()) throw UsageError(origin + ": " + why);
    }
  }
}

// Without model.preset, the shape keys a preset would fill must all be given (checked before
// the table is read: a deck without a shape is told that first).
void check_shape_given(const Reader& r) {
  if (r.has("model", "preset")) return;
  std::vector<std::string> missing, presets;
  for (const model::Preset& p : model::presets()) presets.push_back(p.name);
  for (const char* k : {"hidden", "heads", "kv_heads", "head_dim", "ffn", "layers"})
    if (!r.has("model", k)) missing.push_back(std::string("model.") + k);
  if (!missing.empty())
    throw UsageError("[model]: " + join(missing) + " missing; set them, or model.preset (one of " + join(presets) +
                     ")");
}

// run.window and run.doc_len come with their mask, and only with it; the mask they make.
// sweep.documents likewise: listed documents make each case's mask (make_case), and every
// item is read at every seq_len here, so a bad one is refused before anything runs.
cp::Mask check_mask(const Deck& d) {
  const cp::MaskSpec spec{d.mask, d.window, d.doc_len, !d.documents.empty()};
  const std::string why = cp::Mask::problem(spec, {"run.mask", "run.window", "run.doc_len", "sweep.documents"});
  if (!why.empty()) throw UsageError(why);
  std::map<std::string, std::string> labels;  // label -> item: one label, one item (case ids)
  for (size_t i = 0; i < d.documents.size(); ++i) {
    const std::string& item = d.documents[i];
    const std::string label = documents_label(item, i);
    if (!labels.emplace(label, item).second)
      throw UsageError("sweep.documents: \"" + harness::printable(labels[label]) + "\" and \"" +
                       harness::printable(item) + "\" would both be named " + label + " in case ids");
    for (int64_t S : d.seq_len) document_lengths(item, S, d.seed, "sweep.documents");
  }
  return spec.listed ? cp::Mask::causal() : cp::Mask::from(spec);  // listed: each case its own
}

// run.dkv_accumulator and run.grad_allreduce choose among bf16 run's types: set to bf16 on
// another dtype they would change nothing, so they are refused.
void check_bf16_keys(const Deck& d) {
  // Both are of the backward pass: a sweep without train has no dK/dV accumulator and no
  // gradient all-reduce for them to change.
  const bool trains = std::find(d.passes.begin(), d.passes.end(), model::Pass::Train) != d.passes.end();
  for (const auto& [key, v] :
       {std::pair{"dkv_accumulator", &d.dkv_accumulator}, {"grad_allreduce", &d.grad_allreduce}}) {
    if (*v != "bf16") continue;
    if (d.dtype != "bf16")
      throw UsageError(std::string("run.") + key + " = \"bf16\": only with run.dtype = \"bf16\" (run.dtype is \"" +
                       d.dtype + "\")");
    if (!trains)
      throw UsageError(std::string("run.") + key +
                       " = \"bf16\": only with run.pass including \"train\" (the backward pass it changes); this "
                       "deck runs no train pass");
  }
}

// sweep.schemes: "all" stands alone and becomes every scheme that solves a pass; a named
// scheme must solve one of run.pass.
void expand_schemes(Deck& d) {
  auto solves_a_pass = [&](const cp::SchemeInfo& s) {
    return std::any_of(d.passes.begin(), d.passes.end(), [&](model::Pass pv) {
      return s.solves(pv == model::Pass::Decode ? cp::Problem::Decode : cp::Problem::Train);
    });
  };
  if (d.all_schemes) {
    if (d.schemes.size() > 1) throw UsageError("sweep.schemes: \"all\" must stand alone");
    d.schemes.clear();
    for (const cp::SchemeInfo& s : cp::registry())
      if (solves_a_pass(s)) d.schemes.push_back(s.name);
    return;
  }
  for (const std::string& s : d.schemes) {
    const cp::SchemeInfo& info = cp::find(s);
    if (solves_a_pass(info)) continue;
    std::vector<std::string> passes, can;
    for (model::Pass pv : d.passes) passes.push_back(model::to_string(pv));
    for (cp::Problem pr : info.problems) can.push_back(cp::to_string(pr));
    throw UsageError("sweep.schemes: \"" + s + "\" runs none of run.pass = [" + join(passes) +
                     "] (it solves: " + join(can) + ")");
  }
}

// sweep.seq_len has no default; sweep.ranks defaults to the job's size, and is limited by it
// unless any_ranks.
void check_sizes(Deck& d, int world, bool any_ranks) {
  if (d.seq_len.empty()) throw UsageError("sweep.seq_len: missing (global tokens, e.g. seq_len = [1024, 4096])");
  if (d.ranks.empty()) d.ranks = {world};
  for (int p : d.ranks)
    if (p > world && !any_ranks)
      throw UsageError("sweep.ranks = " + std::to_string(p) + ": larger than the MPI job (" + std::to_string(world) +
                       " ranks); launch at least " + std::to_string(p) + " ranks or lower it");
  for (int tp : d.tp)
    if (const std::string why = model::check_tp(d.shape, tp); !why.empty()) throw UsageError(why);
  for (int tp : d.tp)
    for (int p : d.ranks)
      for (int dp : d.dp) {
        const int64_t need = int64_t(tp) * p * dp;
        if ((tp > 1 || dp > 1) && (need > INT32_MAX || (need > world && !any_ranks)))
          throw UsageError("sweep.tp = " + std::to_string(tp) + ", sweep.ranks = " + std::to_string(p) +
                           ", sweep.dp = " + std::to_string(dp) + ": " + std::to_string(need) +
                           " ranks, more than the MPI job's " + std::to_string(world) + "; launch at least " +
                           std::to_string(need) + " ranks or lower them");
      }
}

// The resolved deck: every key with the value this run uses. A table's keys are kept sorted,
// so the text does not depend on the order of the rows.
std::string resolved_toml(const Deck& d) {
  TomlNode out;
  for (const DeckKey& k : deck_keys()) {
    const KeyValue v = k.get(d);
    const std::string* s = std::get_if<std::string>(&v);
    if (k.resolved == InResolved::Never || (k.resolved == InResolved::WhenSet && s && s->empty())) continue;
    if (!out.get(k.section)) out.set(k.section, TomlNode{});
    TomlNode& sec = *out.get(k.section);
    std::visit([&](const auto& x) { sec.set(k.name, TomlNode::of(x)); }, v);
  }
  return harness::format_toml(out);
}

// What a key's values may be (for --help).
std::string allowed(const DeckKey& k) {
  // A bound that is only the limit of the type is left out (the refusal of a value names it).
  const std::string range =
      k.max >= INT32_MAX ? ">= " + std::to_string(k.min) : std::to_string(k.min) + " to " + std::to_string(k.max);
  const std::string list = ", one or a list, each once";
  switch (k.type) {
    case KeyType::Integer: return "integer " + range;
    case KeyType::Number: return "finite number > " + num(k.above);
    case KeyType::Choice: return join(k.choices, " | ");
    case KeyType::Text: return "string";
    case KeyType::Integers: return "integers " + range + list;
    case KeyType::Choices: return join(k.choices, " | ") + list;
    case KeyType::Documents: return "mix names (--list-mixes), files of lengths, arrays of lengths; a list, each once";
  }
  return "";
}

}  // namespace

namespace {

Deck load_deck_node(TomlNode t, const std::string& path, const std::string& origin,
                    const std::vector<std::string>& sets, int world, bool any_ranks) {
  check_keys(t, origin);
  std::map<std::string, std::string> too_big;
  check_sets_once(sets);
  for (const std::string& s : sets) apply_set(t, s, too_big);
  const Reader r(t, too_big);
  check_shape_given(r);
  Deck d;
  d.path = path;
  for (const DeckKey& k : deck_keys()) r.read(k, d);
  const std::string bad = model::check(d.shape);
  if (!bad.empty()) throw UsageError(bad);
  d.attn_mask = check_mask(d);
  check_bf16_keys(d);
  if (const std::string e = kernels::attention_isa_error(); !e.empty()) throw UsageError(e);
  expand_schemes(d);
  check_sizes(d, world, any_ranks);
  d.resolved = resolved_toml(d);
  return d;
}

}  // namespace

Deck load_deck(const std::string& path, const std::vector<std::string>& sets, int world, bool any_ranks) {
  return load_deck_node(path.empty() ? TomlNode{} : read_file(path), path, "--deck " + path, sets, world, any_ranks);
}

Deck load_deck_text(const std::string& text, const std::string& path, const std::string& origin,
                    const std::vector<std::string>& sets, int world, bool any_ranks) {
  return load_deck_node(parse_deck(text, origin), path, origin, sets, world, any_ranks);
}

namespace {

bool declares(const cp::SchemeInfo& info, const std::string& setting) {
  return std::any_of(info.settings.begin(), info.settings.end(),
                     [&](const cp::Setting& st) { return st.name == setting; });
}

// Every combination of the values of the settings the scheme declares; the others keep their
// first value.
std::vector<std::map<std::string, int>> setting_combos(const Deck& d, const cp::SchemeInfo& info) {
  std::vector<std::map<std::string, int>> combos(1);
  for (const auto& [name, vals] : d.settings) {
    std::vector<std::map<std::string, int>> next;
    for (const auto& c : combos)
      for (size_t i = 0; i < (declares(info, name) ? vals.size() : 1); ++i) {
        auto n = c;
        n[name] = vals[i];
        next.push_back(n);
      }
    combos = next;
  }
  return combos;
}

// The case of one point of the sweep, numbered `index`; its id names the point and the values
// of the settings its scheme declares.
// One sequence's packing: a sweep.documents item at one seq_len (none: the deck's mask).
struct Packing {
  std::string item, label;
  cp::Mask mask;
};
std::vector<Packing> packings(const Deck& d, int64_t S) {
  if (d.documents.empty()) return {Packing{}};
  std::vector<Packing> out;
  for (size_t i = 0; i < d.documents.size(); ++i)
    out.push_back({d.documents[i], documents_label(d.documents[i], i),
                   cp::Mask::documents(document_lengths(d.documents[i], S, d.seed, "sweep.documents"))});
  return out;
}

// The sweep.dispatch items a scheme runs: "layout" and the dispatches it takes; none of them
// listed: the first, which its case then refuses. `none` runs on one rank: "layout" alone.
std::vector<std::string> dispatches_of(const Deck& d, const cp::SchemeInfo& info) {
  if (info.name == "none") return {"layout"};
  std::vector<std::string> out;
  for (const std::string& x : d.dispatch)
    if (x == "layout" || info.takes_dispatch) out.push_back(x);
  return out.empty() ? std::vector<std::string>{d.dispatch.front()} : out;
}

// A dispatch's tokens into the case's attention config, or the reason its scheme refuses it.
std::string apply_dispatch(const Deck& d, const cp::SchemeInfo& info, const std::string& dispatch, cp::Config& a) {
  if (dispatch == "layout") return "";
  if (!info.takes_dispatch)
    return info.name + " takes no dispatch (sweep.dispatch \"" + dispatch + "\"): its layout is its own";
  a.dispatch = dispatch;
  a.tokens = std::make_shared<const std::vector<std::vector<int64_t>>>(
      cp::dispatch_tokens(cp::Dispatch::parse(dispatch, d.dispatch_chunk), a.mask, a.seq_len, a.ranks));
  return "";
}

Case make_case(const Deck& d, int index, model::Pass pass, int64_t S, const comm::Mesh& mesh, int decode_tokens,
               const cp::SchemeInfo& info, const std::map<std::string, int>& settings, const Packing& packing,
               const std::string& dispatch) {
  const int ranks = mesh.cp();
  Case c;
  c.index = index;
  c.info = &info;
  c.scheme = info.name;
  c.stack.shape = d.shape;
  c.stack.pass = pass;
  c.stack.seed = d.seed;
  c.stack.bf16_grad_allreduce = d.grad_allreduce == "bf16";
  c.stack.mesh = mesh;
  c.stack.sequence_parallel = d.sequence_parallel == "on";
  c.stack.tp_overlap = d.tp_overlap == "on";
  cp::Config& a = c.stack.attn;
  a.seq_len = S;
  a.ranks = ranks;
  a.decode_tokens = decode_tokens;
  a.mask = packing.item.empty() ? d.attn_mask : packing.mask;
  c.documents = packing.item, c.documents_label = packing.label;
  a.bf16_dkv = d.dkv_accumulator == "bf16";
  a.settings = settings;
  char id[96];
  std::snprintf(id, sizeof id, "%03d_%s_%s_S%lld_", index, model::to_string(pass), info.name.c_str(), (long long)S);
  c.id = id + ranks_token(mesh);
  if (!packing.item.empty()) c.id += "_docs" + packing.label;
  if (dispatch != "layout") c.id += "_dispatch" + dispatch;
  if (pass == model::Pass::Decode) c.id += "_decode_tokens" + std::to_string(decode_tokens);
  for (const auto& [name, v] : settings)
    if (declares(info, name)) c.id += "_" + name + std::to_string(v);
  const std::string no_dispatch = apply_dispatch(d, info, dispatch, a);
  c.stack.attn = model::attention_config(c.stack);
  c.refused = no_dispatch.empty() ? model::check_mesh(c.stack, info) : no_dispatch;
  if (c.refused.empty()) c.refused = cp::check(info, c.stack.attn);
  if (!c.refused.empty() && mesh.tp() > 1 && c.refused.rfind("mesh ", 0) != 0)
    c.refused =
        "mesh " + mesh.id() + " (" + std::to_string(c.stack.attn.heads) + " query heads per TP rank): " + c.refused;
  return c;
}

}  // namespace

namespace {

// The sweep's meshes: each CP degree (sweep.ranks) with each tp and dp, in that order.
std::vector<comm::Mesh> meshes(const Deck& d) {
  std::vector<comm::Mesh> out;
  for (int P : d.ranks)
    for (int tp : d.tp)
      for (int dp : d.dp) out.emplace_back(tp, P, dp, d.rank_order);
  return out;
}

}  // namespace

std::string ranks_token(const comm::Mesh& mesh) {
  return mesh.id().empty() ? "P" + std::to_string(mesh.cp()) : mesh.id();
}

std::vector<Case> make_cases(const Deck& d) {
  std::vector<Case> cases;
  const std::vector<comm::Mesh> sweep_meshes = meshes(d);
  for (model::Pass pass : d.passes)
    for (int64_t S : d.seq_len)
      for (const Packing& packing : packings(d, S))
        for (const comm::Mesh& sized : sweep_meshes)
          for (const std::string& name : d.schemes) {
            const cp::SchemeInfo& info = cp::find(name);
            if (!info.solves(pass == model::Pass::Decode ? cp::Problem::Decode : cp::Problem::Train)) continue;
            // the reference: once per problem, on one rank
            if (name == "none" && &sized != &sweep_meshes.front()) continue;
            const comm::Mesh mesh = name == "none" ? comm::Mesh() : sized;
            // decode_tokens is a size of the decode problem: the other passes take its first value.
            const size_t n_tokens = pass == model::Pass::Decode ? d.decode_tokens.size() : 1;
            for (size_t t = 0; t < n_tokens; ++t)
              for (const std::string& dispatch : dispatches_of(d, info))
                for (const auto& combo : setting_combos(d, info)) {
                  Case c = make_case(d, int(cases.size()), pass, S, mesh, d.decode_tokens[t], info, combo, packing,
                                     dispatch);
                  // Named schemes must run, except where a sweep of several dispatches
                  // crosses one with a scheme that cannot run it: that case is listed refused.
                  const bool crossed = dispatch != "layout" && d.dispatch.size() > 1;
                  if (!c.refused.empty() && !d.all_schemes && !crossed)
                    throw UsageError("sweep case " + c.id + " cannot run: " + c.refused);
                  cases.push_back(c);
                }
          }
  // Ids sort as the sweep runs: the index is padded to the width of the largest (3 at least).
  const int width = std::max<int>(3, int(std::to_string(cases.empty() ? 0 : cases.size() - 1).size()));
  for (Case& c : cases) {
    const std::string index = std::to_string(c.index);
    c.id = std::string(size_t(width) - std::min<size_t>(size_t(width), index.size()), '0') + index +
           c.id.substr(c.id.find('_'));
  }
  return cases;
}

std::string deck_keys_json(int indent) {
  harness::Json all = harness::Json::array();
  for (const DeckKey& k : deck_keys()) {
    const char* resolved = k.resolved == InResolved::Always    ? "always"
                           : k.resolved == InResolved::WhenSet ? "when set"
                                                               : "never";
    all.push_back({{"section", k.section},
                   {"key", k.name},
                   {"allowed", allowed(k)},
                   {"default", k.default_toml},
                   {"default_note", k.default_note},
                   {"help", k.help},
                   {"in_resolved", resolved}});
  }
  return all.dump(indent);
}

std::string deck_keys_help() {
  std::string h = "Deck keys (TOML; --set section.key=value overrides one, the value in TOML syntax):\n";
  std::string section;
  for (const DeckKey& k : deck_keys()) {
    if (k.section != section) h += "  [" + (section = k.section) + "]\n";
    // The default as written in a deck, with what it means; or the words for one not fixed.
    const std::string def = k.default_toml.empty()
                                ? k.default_note
                                : k.default_toml + (k.default_note.empty() ? "" : ": " + k.default_note);
    const size_t w = 16;  // the name column
    h += "    " + k.name + std::string(k.name.size() < w ? w - k.name.size() : 1, ' ') + allowed(k) +
         " (default: " + def + ")\n";
    h += "    " + std::string(w, ' ') + k.help + (k.resolved == InResolved::Never ? "; not in the resolved deck" : "") +
         "\n";
  }
  return h;
}

}  // namespace minicp::run
