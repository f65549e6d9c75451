// Input decks: a TOML file (plus --set overrides) read into a validated Deck, and the sweep
// it describes cut into Cases. Every key is one row of deck_keys() (the registry's scheme
// settings are rows of [sweep]); a message about bad input names the key as the user wrote it
// (`run.reps`), the value and what is allowed.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "miniapp/cp/scheme.hpp"
#include "miniapp/model/layer.hpp"

namespace minicp::run {

// What load_deck read: each key's value (its default when the deck leaves it out; the
// defaults are in deck_keys()) after the checks between keys.
struct Deck {
  std::string path;      // the deck file ("" when none)
  std::string resolved;  // the deck after --set and preset expansion, as TOML text
  std::string preset;    // model.preset ("" when none)
  model::Shape shape;
  std::vector<model::Pass> passes;  // run.pass: one or a list
  std::string mask;                 // run.mask: one of cp::Mask::kind_names()
  int64_t window = 0, doc_len = 0;  // run.window, run.doc_len: the mask's sizes
  cp::Mask attn_mask;               // what they resolve to (check_mask), every case's
  std::string dtype;                // f32 | f64 | bf16
  // bf16 runs: the dK/dV ring accumulators' and the weight-gradient all-reduce's type (f32 | bf16)
  std::string dkv_accumulator, grad_allreduce;
  int warmup = 0, reps = 0;
  int rounds = 1;  // run.rounds: passes over the cases, each running every case's warm-up and reps
  std::vector<cp::Mode> modes;
  uint64_t seed = 0;
  std::string progress;  // communication progress: thread | none
  // run.stall_timeout_s: the stall watchdog's limit (0: off). Not in `resolved`: it changes
  // nothing measured, and a run may be resumed with another limit.
  int64_t stall_timeout_s = 0;
  std::string calibration;           // run.calibration: a table file, "measure", or "" (no prediction)
  std::string fabric;                // run.fabric: a profile name or file ("" : MPI's own defaults)
  std::vector<std::string> schemes;  // names, "all" expanded (each runs the passes it solves)
  bool all_schemes = false;          // sweep.schemes = ["all"]: cases a scheme refuses are skipped
  std::vector<int64_t> seq_len;
  std::vector<int> ranks;                            // sweep.ranks: CP degrees
  std::vector<int> tp, dp;                           // sweep.tp, sweep.dp: tensor- and data-parallel degrees
  std::string sequence_parallel;                     // run.sequence_parallel: on | off
  std::string tp_overlap;                            // run.tp_overlap: on | off
  std::string rank_order;                            // run.rank_order: the mesh's axis order (comm::Mesh)
  std::vector<int> decode_tokens;                    // the decode pass's query tokens
  std::vector<std::string> documents;                // sweep.documents' items (documents.hpp); empty: none
  std::vector<std::string> dispatch;                 // sweep.dispatch: "layout" (the scheme's own) or a dispatch
  int64_t dispatch_chunk = 128;                      // run.dispatch_chunk: the area dispatch's chunk, tokens
  std::map<std::string, std::vector<int>> settings;  // each registry setting: its values
  std::string output_file;
};

// One key's value as read from TOML: an integer, a number, a string, or a list of either.
using KeyValue = std::variant<int64_t, double, std::string, std::vector<int64_t>, std::vector<std::string>>;

// integer: in [min, max]; number: finite and > above; choice: one of `choices`; text: any
// string; integers and choices: one value or an array of them, each listed once.
// documents: a list (maybe empty), each a string or an array of integers >= 1 (held as its
// TOML text, "[1, 37, 900]"), each listed once.
enum class KeyType { Integer, Number, Choice, Text, Integers, Choices, Documents };

// Whether Deck::resolved (which --resume compares with the file's) holds the key: always,
// only when its value is not the empty string, or never (it changes nothing measured).
enum class InResolved { Always, WhenSet, Never };

// One deck key: how it is read, checked, described, where its value goes, and where it is
// recorded. load_deck, --help (deck_keys_help), the resolved deck and the case attributes of
// the results file (run::case_attrs) all loop over these.
struct DeckKey {
  std::string section, name;  // "run", "reps": written run.reps
  KeyType type = KeyType::Integer;
  std::string help;                  // what it does, with units
  int64_t min = 0, max = INT64_MAX;  // integer, integers
  double above = 0;                  // number
  std::vector<std::string> choices;  // choice, choices
  // The default as a TOML value, read like a value of the deck; "" when there is no fixed
  // default (the key is then left to the code after the table, see load_deck).
  std::string default_toml;
  std::string default_note;  // what the default means, or what it is when not fixed
  InResolved resolved = InResolved::Always;
  bool case_attr = false;  // also an attribute of each case (/cases/<id>/) in the results file
  std::function<void(Deck&, const KeyValue&)> set;
  std::function<KeyValue(const Deck&)> get;

  std::string id() const { return section + "." + name; }
};

// Every deck key, section by section ([model], [run], [sweep] with the registry's settings,
// [output]), in the order --help and the unknown-key message list them.
const std::vector<DeckKey>& deck_keys();

// One --set override, "section.key=value", split and trimmed (spaces around the dot and the
// '=' are allowed). Throws harness::UsageError naming the override when it is malformed, holds a
// line break, or names no deck key.
struct SetOverride {
  std::string section, key, value;  // value: the TOML text after '='
  std::string id() const { return section + "." + key; }
};
SetOverride parse_set(const std::string& set);

// Reads the deck at path (empty: only the defaults and the sets) and applies the --set
// overrides ("section.key=<TOML value>"), then validates every key. world: ranks of the MPI
// job (sweep.ranks' default, and its limit unless any_ranks: a dry run plans for any job
// size). Throws harness::UsageError.
Deck load_deck(const std::string& path, const std::vector<std::string>& sets, int world, bool any_ranks = false);
// The same from a deck's text held in memory (a results file's resolved deck): path is what
// the Deck records as its path, origin names the text in messages ("--against r.h5 (its deck)").
Deck load_deck_text(const std::string& text, const std::string& path, const std::string& origin,
                    const std::vector<std::string>& sets, int world, bool any_ranks = false);

// One point of the sweep.
struct Case {
  int index = 0;  // 0-based, in sweep order
  // "<index>_<pass>_<scheme>_S<seq_len>_<ranks_token>[_docs<label>][_decode_tokens<T>][_<setting><value>...]"
  std::string id;
  std::string documents;  // the sweep.documents item of its mask ("" without one), and its id label
  std::string documents_label;
  // The scheme, found once by make_cases (the registry's entry, which outlives every case);
  // `scheme` is its name.
  const cp::SchemeInfo* info = nullptr;
  std::string scheme;
  // Shape, pass, seed, and the attention config the case runs, resolved by make_cases
  // (stack.attn == model::attention_config(stack): heads, head_dim and problem filled in).
  model::StackConfig stack;
  std::string refused;  // "" or the scheme's reason (only kept when sweep.schemes is "all")
};

// A case's ranks in its id and summary token: "P<cp>" on a pure CP group (the ids of such
// cases keep their form), the mesh's id ("T1C2D2") where TP or DP is above 1.
std::string ranks_token(const comm::Mesh& mesh);

// The cases of the sweep: for each pass, seq_len, ranks, dp and scheme that solves the pass (and
// for the decode pass each decode_tokens), each combination of the values of the settings the
// scheme declares (other settings take their first value). `none` is the single-rank
// reference: it runs at ranks 1 (and dp 1) only, once per problem (pass, seq_len, decode_tokens).
// Throws UsageError for a named scheme that cannot run a case (its check() sentence); with
// ["all"] such cases are kept with `refused` set.
std::vector<Case> make_cases(const Deck& d);

// Every deck key (deck_keys()) with its allowed values, default and help (for --help).
std::string deck_keys_help();
// The same as JSON (minicp --list-deck-keys --json): [{section, key, allowed, default, help,
// in_resolved}] in table order, what docs/deck-keys.md is held to.
std::string deck_keys_json(int indent = -1);

}  // namespace minicp::run
