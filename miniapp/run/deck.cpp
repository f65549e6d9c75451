// Deck reading and validation (toml++), and the sweep's cases.
#include "miniapp/run/deck.hpp"

#include <toml++/toml.h>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "harness/main.hpp"

namespace minicp::run {
namespace {

using harness::UsageError;

// The keys of each section (the registry's scheme settings are added to [sweep]).
const std::vector<std::pair<std::string, std::vector<std::string>>>& section_keys() {
  static const auto keys = [] {
    std::vector<std::pair<std::string, std::vector<std::string>>> k = {
        {"model", {"preset", "hidden", "heads", "kv_heads", "head_dim", "ffn", "layers", "rope_theta", "norm_eps"}},
        {"run",
         {"pass", "mask", "window", "doc_len", "dtype", "warmup", "reps", "modes", "seed", "progress",
          "stall_timeout_s"}},
        {"sweep", {"schemes", "seq_len", "ranks"}},
        {"output", {"file"}}};
    for (const cp::Setting& st : cp::all_settings()) k[2].second.push_back(st.name);
    return k;
  }();
  return keys;
}

std::string join(const std::vector<std::string>& v, const std::string& sep = ", ") {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
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

const char* type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date or time";
  }
}

// Typed, range-checked access to the deck's values; messages name section.key.
class Reader {
 public:
  // too_big: "section.key" -> the text of a --set value that holds an integer beyond 64 bits
  // (TOML cannot hold it, so apply_set kept it as a string; it is reported as out of range).
  Reader(const toml::table& t, std::map<std::string, std::string> too_big) : t_(t), too_big_(std::move(too_big)) {}
  const toml::node* node(const std::string& s, const std::string& k) const {
    const toml::node* sec = t_.get(s);
    return sec && sec->is_table() ? sec->as_table()->get(k) : nullptr;
  }
  bool has(const std::string& s, const std::string& k) const { return node(s, k) != nullptr; }

  int64_t integer(const std::string& s, const std::string& k, int64_t def, int64_t lo, int64_t hi) const {
    const toml::node* n = node(s, k);
    if (!n) return def;
    return check_int(s + "." + k, *n, lo, hi);
  }
  double number(const std::string& s, const std::string& k, double def, double lo_excl) const {
    const toml::node* n = node(s, k);
    if (!n) return def;
    double v = 0;
    if (auto i = n->value_exact<int64_t>()) v = double(*i);
    else if (auto d = n->value_exact<double>()) v = *d;
    else throw UsageError(s + "." + k + ": expected a number, got " + type_name(*n));
    if (!std::isfinite(v) || !(v > lo_excl))
      throw UsageError(s + "." + k + " = " + num(v) + ": must be a finite number > " + num(lo_excl));
    return v;
  }
  std::string choice(const std::string& s, const std::string& k, const std::string& def,
                     const std::vector<std::string>& allowed) const {
    const toml::node* n = node(s, k);
    if (!n) return def;
    return check_choice(s + "." + k, *n, allowed);
  }
  std::string text(const std::string& s, const std::string& k, const std::string& def) const {
    const toml::node* n = node(s, k);
    if (!n) return def;
    if (!n->is_string()) throw UsageError(s + "." + k + ": expected a string, got " + type_name(*n));
    return *n->value<std::string>();
  }
  // An integer or an array of integers, each listed once (a value twice would run its cases twice).
  std::vector<int64_t> integers(const std::string& s, const std::string& k, const std::vector<int64_t>& def,
                                int64_t lo, int64_t hi) const {
    const toml::node* n = node(s, k);
    if (!n) return def;
    const std::string key = s + "." + k;
    std::vector<int64_t> out;
    if (const toml::array* a = n->as_array()) {
      if (a->empty()) throw UsageError(key + ": the array is empty (give at least one value)");
      for (const toml::node& e : *a) {
        out.push_back(check_int(key, e, lo, hi));
        if (std::count(out.begin(), out.end(), out.back()) > 1)
          throw UsageError(key + ": " + std::to_string(out.back()) + " is listed twice");
      }
    } else {
      out.push_back(check_int(key, *n, lo, hi));
    }
    return out;
  }
  // A string or an array of strings, each from allowed (empty allowed: any).
  std::vector<std::string> strings(const std::string& s, const std::string& k, const std::vector<std::string>& def,
                                   const std::vector<std::string>& allowed) const {
    const toml::node* n = node(s, k);
    if (!n) return def;
    const std::string key = s + "." + k;
    std::vector<std::string> out;
    if (const toml::array* a = n->as_array()) {
      if (a->empty()) throw UsageError(key + ": the array is empty (give at least one value)");
      for (const toml::node& e : *a) out.push_back(check_choice(key, e, allowed));
    } else {
      out.push_back(check_choice(key, *n, allowed));
    }
    return out;
  }

 private:
  static std::string num(double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%g", v);
    return b;
  }
  int64_t check_int(const std::string& key, const toml::node& n, int64_t lo, int64_t hi) const {
    const auto big = too_big_.find(key);
    if (big != too_big_.end())
      throw UsageError(key + " = " + big->second + ": integer out of range: must be between " + std::to_string(lo) +
                       " and " + std::to_string(hi));
    const auto v = n.value_exact<int64_t>();
    if (!v) throw UsageError(key + ": expected an integer, got " + type_name(n));
    if (*v < lo || *v > hi) {
      const std::string allowed = hi == INT64_MAX ? ">= " + std::to_string(lo)
                                                  : "between " + std::to_string(lo) + " and " + std::to_string(hi);
      throw UsageError(key + " = " + std::to_string(*v) + ": must be " + allowed);
    }
    return *v;
  }
  static std::string check_choice(const std::string& key, const toml::node& n, const std::vector<std::string>& allowed) {
    if (!n.is_string()) throw UsageError(key + ": expected a string, got " + type_name(n));
    const std::string v = *n.value<std::string>();
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), v) == allowed.end())
      throw UsageError(key + " = \"" + v + "\": not one of " + join(allowed));
    return v;
  }
  const toml::table& t_;
  std::map<std::string, std::string> too_big_;
};

toml::table read_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw UsageError("--deck " + path + ": is a directory; give the deck file (TOML)");
  std::ifstream f(path);
  if (!f) throw UsageError("--deck " + path + ": no such file or not readable");
  try {
    return toml::parse(f, path);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw UsageError("--deck " + path + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) +
                     ": malformed TOML: " + std::string(e.description()));
  }
}

// Whether a --set value that TOML refused is integers only (one or an array): then an integer
// is beyond 64 bits, and the value is out of range rather than a word.
bool integer_text(const std::string& v) {
  return v.find_first_of("0123456789") != std::string::npos &&
         v.find_first_not_of("0123456789+-_,[] ") == std::string::npos;
}

// "section.key=value": value as TOML (a bare word that is not TOML is taken as a string).
// too_big gets "section.key" -> value when the value is an integer TOML cannot hold.
void apply_set(toml::table& t, const std::string& set, std::map<std::string, std::string>& too_big) {
  const size_t eq = set.find('='), dot = set.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq)
    throw UsageError("--set " + set + ": expected section.key=value (e.g. --set run.reps=5)");
  const std::string section = set.substr(0, dot), key = set.substr(dot + 1, eq - dot - 1), value = set.substr(eq + 1);
  const std::string bad = unknown_key(section, key);
  if (!bad.empty()) throw UsageError("--set " + set + ": " + bad);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed.insert_or_assign("v", value);
    if (integer_text(value)) too_big[section + "." + key] = value;
  }
  if (!t.contains(section)) t.insert(section, toml::table{});
  toml::table* sec = t[section].as_table();
  if (!sec) throw UsageError("--set " + set + ": [" + section + "] in the deck is not a table");
  sec->insert_or_assign(key, *parsed.get("v"));
}

void check_keys(const toml::table& t, const std::string& path) {
  for (const auto& [sk, sec] : t) {
    const std::string s(sk.str());
    const std::string bad = unknown_key(s, "");
    if (bad.rfind("unknown section", 0) == 0) throw UsageError("--deck " + path + ": " + bad);
    if (!sec.is_table()) throw UsageError("--deck " + path + ": " + s + " must be a table ([" + s + "])");
    for (const auto& [k, v] : *sec.as_table()) {
      const std::string why = unknown_key(s, std::string(k.str()));
      if (!why.empty()) throw UsageError("--deck " + path + ": " + why);
    }
  }
}

}  // namespace

Deck load_deck(const std::string& path, const std::vector<std::string>& sets, int world, bool any_ranks) {
  toml::table t = path.empty() ? toml::table{} : read_file(path);
  check_keys(t, path);
  std::map<std::string, std::string> too_big;
  for (const std::string& s : sets) apply_set(t, s, too_big);
  const Reader r(t, too_big);
  Deck d;
  d.path = path;

  // [model]: the preset fills the shape; explicit keys override it.
  std::vector<std::string> names;
  for (const model::Preset& p : model::presets()) names.push_back(p.name);
  d.preset = r.choice("model", "preset", "", names);
  if (!d.preset.empty()) {
    d.shape = *model::find_preset(d.preset);
  } else {
    std::vector<std::string> missing;
    for (const char* k : {"hidden", "heads", "kv_heads", "head_dim", "ffn", "layers"})
      if (!r.has("model", k)) missing.push_back(std::string("model.") + k);
    if (!missing.empty())
      throw UsageError("[model]: " + join(missing) + " missing; set them, or model.preset (one of " + join(names) + ")");
  }
  model::Shape& m = d.shape;
  m.hidden = int(r.integer("model", "hidden", m.hidden, 1, 1 << 20));
  m.heads = int(r.integer("model", "heads", m.heads, 1, 1 << 12));
  m.kv_heads = int(r.integer("model", "kv_heads", m.kv_heads, 1, 1 << 12));
  m.head_dim = int(r.integer("model", "head_dim", m.head_dim, 2, 1 << 12));
  m.ffn = int(r.integer("model", "ffn", m.ffn, 1, 1 << 22));
  m.layers = int(r.integer("model", "layers", m.layers, 1, 1 << 12));
  m.rope_theta = r.number("model", "rope_theta", m.rope_theta, 1.0);
  m.norm_eps = r.number("model", "norm_eps", m.norm_eps, 0.0);
  const std::string bad = model::check(m);
  if (!bad.empty()) throw UsageError(bad);

  // [run]
  const auto pass_names = r.strings("run", "pass", {"train"}, {"train", "prefill", "decode"});
  d.passes.clear();
  for (const std::string& ps : pass_names) {
    const model::Pass pv =
        ps == "train" ? model::Pass::Train : ps == "prefill" ? model::Pass::Prefill : model::Pass::Decode;
    if (std::find(d.passes.begin(), d.passes.end(), pv) != d.passes.end())
      throw UsageError("run.pass: \"" + ps + "\" is listed twice");
    d.passes.push_back(pv);
  }
  d.mask = r.choice("run", "mask", "causal", {"causal", "full", "window", "documents"});
  d.window = r.integer("run", "window", 0, 0, INT64_MAX);
  d.doc_len = r.integer("run", "doc_len", 0, 0, INT64_MAX);
  if (d.mask == "window" && d.window < 1) throw UsageError("run.window: needs a value >= 1 with run.mask = \"window\"");
  if (d.mask != "window" && d.window != 0)
    throw UsageError("run.window = " + std::to_string(d.window) + ": only with run.mask = \"window\"");
  if (d.mask == "documents" && d.doc_len < 1)
    throw UsageError("run.doc_len: needs a value >= 1 with run.mask = \"documents\"");
  if (d.mask != "documents" && d.doc_len != 0)
    throw UsageError("run.doc_len = " + std::to_string(d.doc_len) + ": only with run.mask = \"documents\"");
  d.dtype = r.choice("run", "dtype", "f32", {"f32", "f64"});
  d.warmup = int(r.integer("run", "warmup", 1, 0, 1000000));
  d.reps = int(r.integer("run", "reps", 3, 1, 1000000));
  d.modes.clear();
  for (const std::string& s : r.strings("run", "modes", {"full"}, {"full", "compute-only", "comm-only"})) {
    const cp::Mode md = cp::parse_mode(s);
    if (std::find(d.modes.begin(), d.modes.end(), md) != d.modes.end())
      throw UsageError("run.modes: \"" + s + "\" is listed twice");
    d.modes.push_back(md);
  }
  d.seed = uint64_t(r.integer("run", "seed", 1, 0, INT64_MAX));
  d.progress = r.choice("run", "progress", "thread", {"thread", "none"});
  d.stall_timeout_s = r.integer("run", "stall_timeout_s", d.stall_timeout_s, 0, 1000000);

  // [sweep]
  std::vector<std::string> scheme_names = {"all"};
  for (const cp::SchemeInfo& s : cp::registry()) scheme_names.push_back(s.name);
  const auto schemes = r.strings("sweep", "schemes", {"all"}, scheme_names);
  auto problem_of = [](model::Pass pv) { return pv == model::Pass::Decode ? cp::Problem::Decode : cp::Problem::Train; };
  auto solves_a_pass = [&](const cp::SchemeInfo& s) {
    return std::any_of(d.passes.begin(), d.passes.end(), [&](model::Pass pv) { return s.solves(problem_of(pv)); });
  };
  d.all_schemes = std::find(schemes.begin(), schemes.end(), "all") != schemes.end();
  if (d.all_schemes && schemes.size() > 1) throw UsageError("sweep.schemes: \"all\" must stand alone");
  if (d.all_schemes) {
    for (const cp::SchemeInfo& s : cp::registry())
      if (solves_a_pass(s)) d.schemes.push_back(s.name);
  } else {
    std::set<std::string> seen;
    for (const std::string& s : schemes) {
      if (!seen.insert(s).second) throw UsageError("sweep.schemes: \"" + s + "\" is listed twice");
      const cp::SchemeInfo& info = cp::find(s);
      if (!solves_a_pass(info)) {
        std::string can;
        for (cp::Problem pr : info.problems) can += std::string(can.empty() ? "" : ", ") + cp::to_string(pr);
        throw UsageError("sweep.schemes: \"" + s + "\" runs none of run.pass = [" + join(pass_names) +
                         "] (it solves: " + can + ")");
      }
      d.schemes.push_back(s);
    }
  }
  if (!r.has("sweep", "seq_len")) throw UsageError("sweep.seq_len: missing (global tokens, e.g. seq_len = [1024, 4096])");
  d.seq_len = r.integers("sweep", "seq_len", {}, 1, INT64_MAX / 2);
  for (int64_t p : r.integers("sweep", "ranks", {int64_t(world)}, 1, INT32_MAX)) {
    if (p > world && !any_ranks)
      throw UsageError("sweep.ranks = " + std::to_string(p) + ": larger than the MPI job (" + std::to_string(world) +
                       " ranks); launch at least " + std::to_string(p) + " ranks or lower it");
    d.ranks.push_back(int(p));
  }
  for (const cp::Setting& st : cp::all_settings())
    for (int64_t v : r.integers("sweep", st.name, {int64_t(st.default_value)}, st.min_value, INT32_MAX))
      d.settings[st.name].push_back(int(v));

  // [output]
  d.output_file = r.text("output", "file", "");

  // The resolved deck: every key with the value this run uses.
  toml::table out;
  toml::table tm, tr, ts, to;
  if (!d.preset.empty()) tm.insert("preset", d.preset);
  tm.insert("hidden", m.hidden), tm.insert("heads", m.heads), tm.insert("kv_heads", m.kv_heads);
  tm.insert("head_dim", m.head_dim), tm.insert("ffn", m.ffn), tm.insert("layers", m.layers);
  tm.insert("rope_theta", m.rope_theta), tm.insert("norm_eps", m.norm_eps);
  toml::array passes;
  for (const std::string& ps : pass_names) passes.push_back(ps);
  tr.insert("pass", passes), tr.insert("mask", d.mask), tr.insert("window", d.window), tr.insert("doc_len", d.doc_len);
  tr.insert("dtype", d.dtype), tr.insert("warmup", d.warmup), tr.insert("reps", d.reps);
  toml::array modes;
  for (cp::Mode md : d.modes) modes.push_back(cp::to_string(md));
  tr.insert("modes", modes), tr.insert("seed", int64_t(d.seed)), tr.insert("progress", d.progress);
  toml::array sch, sl, rk;
  for (const auto& s : schemes) sch.push_back(s);
  for (int64_t s : d.seq_len) sl.push_back(s);
  for (int p : d.ranks) rk.push_back(p);
  ts.insert("schemes", sch), ts.insert("seq_len", sl), ts.insert("ranks", rk);
  for (const auto& [name, vals] : d.settings) {
    toml::array a;
    for (int v : vals) a.push_back(v);
    ts.insert(name, a);
  }
  if (!d.output_file.empty()) to.insert("file", d.output_file);
  out.insert("model", tm), out.insert("run", tr), out.insert("sweep", ts);
  if (!to.empty()) out.insert("output", to);
  std::ostringstream os;
  os << out;
  d.resolved = os.str();
  return d;
}

std::vector<Case> make_cases(const Deck& d) {
  std::vector<Case> cases;
  for (model::Pass pass : d.passes)
  for (int64_t S : d.seq_len)
    for (int P : d.ranks)
      for (const std::string& name : d.schemes) {
        const cp::SchemeInfo& info = cp::find(name);
        if (!info.solves(pass == model::Pass::Decode ? cp::Problem::Decode : cp::Problem::Train)) continue;
        if (name == "none" && P != d.ranks.front()) continue;  // the reference: once per pass and seq_len
        const int ranks = name == "none" ? 1 : P;
        // Combinations of the values of the settings this scheme declares.
        std::vector<std::map<std::string, int>> combos(1);
        for (const auto& [sname, vals] : d.settings) {
          const bool own = std::any_of(info.settings.begin(), info.settings.end(),
                                       [&](const cp::Setting& st) { return st.name == sname; });
          std::vector<std::map<std::string, int>> next;
          for (const auto& c : combos)
            for (size_t i = 0; i < (own ? vals.size() : 1); ++i) {
              auto n = c;
              n[sname] = vals[i];
              next.push_back(n);
            }
          combos = next;
        }
        for (const auto& combo : combos) {
          Case c;
          c.index = int(cases.size());
          c.scheme = name;
          c.stack.shape = d.shape;
          c.stack.pass = pass;
          c.stack.seed = d.seed;
          cp::Config& a = c.stack.attn;
          a.seq_len = S;
          a.ranks = ranks;
          a.causal = d.mask != "full";
          a.window = d.window;
          a.doc_len = d.doc_len;
          std::string tag;
          for (const cp::Setting& st : cp::all_settings()) {
            a.*st.field = combo.at(st.name);
            const bool own = std::any_of(info.settings.begin(), info.settings.end(),
                                         [&](const cp::Setting& o) { return o.name == st.name; });
            if (own) tag += "_" + st.name + std::to_string(combo.at(st.name));
          }
          char id[96];
          std::snprintf(id, sizeof id, "%03d_%s_%s_S%lld_P%d", c.index, model::to_string(pass), name.c_str(),
                        (long long)S, ranks);
          c.id = id + tag;
          c.refused = cp::check(info, model::attention_config(c.stack));
          if (!c.refused.empty() && !d.all_schemes)
            throw UsageError("sweep case " + c.id + " cannot run: " + c.refused);
          cases.push_back(c);
        }
      }
  return cases;
}

std::string deck_keys_help() {
  std::string h =
      "Deck keys (TOML; --set section.key=value overrides one):\n"
      "  [model]  preset = tiny | cpu-small | llama3-8b | llama3-70b (fills the keys below; explicit keys "
      "override)\n"
      "           hidden, heads, kv_heads, head_dim (even), ffn, layers (integers >= 1), rope_theta (finite, > 1), "
      "norm_eps (finite, > 0)\n"
      "  [run]    pass = train | prefill | decode, or a list (train)     mask = causal | full | window | documents (causal)\n"
      "           window (tokens, with mask window)      doc_len (tokens, with mask documents)\n"
      "           dtype = f32 | f64 (f32)   warmup (1)   reps (3)   seed (1)   progress = thread | none (thread)\n"
      "           modes = list of full, compute-only, comm-only ([\"full\"])\n"
      "           stall_timeout_s = seconds a rank may make no progress before the job is ended (600; 0: off; "
      "<= 1000000)\n"
      "  [sweep]  schemes = names or [\"all\"] (all: every scheme that solves the pass)\n"
      "           seq_len = global tokens, one or a list (required; decode: the KV-cache length)\n"
      "           ranks = CP group sizes <= the MPI job (the job's size)\n";
  for (const cp::Setting& st : cp::all_settings())
    h += "           " + st.name + " = " + st.help + " (" + std::to_string(st.default_value) + "; >= " +
         std::to_string(st.min_value) + ")\n";
  h += "  [output] file = the HDF5 results file (--out overrides it)\n";
  return h;
}

}  // namespace minicp::run
