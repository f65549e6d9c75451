// Input decks: a TOML file (plus --set overrides) read into a validated Deck, and the sweep
// it describes cut into Cases. Every key is known here once (kDeckKeys and the registry's
// scheme settings); a message about bad input names the key as the user wrote it
// (`run.reps`), the value and what is allowed.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "miniapp/cp/scheme.hpp"
#include "miniapp/model/layer.hpp"

namespace minicp::run {

struct Deck {
  std::string path;          // the deck file ("" when none)
  std::string resolved;      // the deck after --set and preset expansion, as TOML text
  std::string preset;        // model.preset ("" when none)
  model::Shape shape;
  std::vector<model::Pass> passes = {model::Pass::Train};  // run.pass: one or a list
  std::string mask = "causal";  // causal | full | window | documents
  int64_t window = 0, doc_len = 0;
  std::string dtype = "f32";    // f32 | f64
  int warmup = 1, reps = 3;
  std::vector<cp::Mode> modes = {cp::Mode::Full};
  uint64_t seed = 1;
  std::string progress = "thread";  // communication progress: thread | none
  // run.stall_timeout_s: the stall watchdog's limit (0: off). Not in `resolved`: it changes
  // nothing measured, and a run may be resumed with another limit.
  int64_t stall_timeout_s = 600;
  std::vector<std::string> schemes;  // names, "all" expanded (each runs the passes it solves)
  bool all_schemes = false;          // sweep.schemes = ["all"]: cases a scheme refuses are skipped
  std::vector<int64_t> seq_len;
  std::vector<int> ranks;
  std::map<std::string, std::vector<int>> settings;  // each registry setting: its values
  std::string output_file;
};

// Reads the deck at path (empty: only the defaults and the sets) and applies the --set
// overrides ("section.key=<TOML value>"), then validates every key. world: ranks of the MPI
// job (sweep.ranks' default, and its limit unless any_ranks: a dry run plans for any job
// size). Throws harness::UsageError.
Deck load_deck(const std::string& path, const std::vector<std::string>& sets, int world, bool any_ranks = false);

// One point of the sweep.
struct Case {
  int index = 0;        // 0-based, in sweep order
  std::string id;       // "<index>_<pass>_<scheme>_S<seq_len>_P<ranks>[_<setting><value>...]"
  std::string scheme;
  model::StackConfig stack;  // shape, pass, seed, attention config (seq_len, ranks, mask, settings)
  std::string refused;       // "" or the scheme's reason (only kept when sweep.schemes is "all")
};

// The cases of the sweep: for each pass, seq_len, ranks and scheme that solves the pass, each
// combination of the values of the settings the scheme declares (other settings take their
// first value). `none` is the single-rank reference: it runs at ranks 1 only, once per pass
// and seq_len. Throws UsageError for a named scheme that cannot run a case (its check()
// sentence); with ["all"] such cases are kept with `refused` set.
std::vector<Case> make_cases(const Deck& d);

// A table of every deck key with its type, default and allowed values (for --help).
std::string deck_keys_help();

}  // namespace minicp::run
