// The deck key table (miniapp/run/deck.hpp, deck_keys()), row by row: each key is listed in
// --help with its default, accepts its default through --set, refuses a value of another type
// with a message naming it, and is in the resolved deck unless its row leaves it out. One
// process, no MPI (load_deck reads and checks; nothing runs). And the figures of merit from
// step rows given here.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>

#include <string>
#include <type_traits>
#include <vector>

#include "harness/main.hpp"
#include "harness/toml.hpp"
#include "miniapp/model/model.hpp"
#include "miniapp/run/deck.hpp"
#include "miniapp/run/documents.hpp"
#include "miniapp/run/figures.hpp"

namespace harness = minicp::harness;
namespace run = minicp::run;
using run::DeckKey;
using run::KeyType;

namespace {

const std::string kTiny = MINICP_INPUTS_DIR "/tiny.toml";

// The tiny deck with the sets, for a job of 4 ranks (sweep.ranks' default and limit).
run::Deck tiny(const std::vector<std::string>& sets = {}) { return run::load_deck(kTiny, sets, 4); }

harness::TomlNode resolved(const std::vector<std::string>& sets = {}) {
  return harness::parse_toml(tiny(sets).resolved);
}

// The value of section.key in a document; nullptr when it has none.
const harness::TomlNode* at(const harness::TomlNode& t, const DeckKey& k) {
  const harness::TomlNode* sec = t.get(k.section);
  return sec ? sec->get(k.name) : nullptr;
}

bool in_resolved(const DeckKey& k, const std::vector<std::string>& sets) { return at(resolved(sets), k) != nullptr; }

// The key's line in the help text: under its section's header, starting with its name.
std::string help_line(const DeckKey& k) {
  const std::string help = run::deck_keys_help();
  const size_t section = help.find("  [" + k.section + "]\n");
  if (section == std::string::npos) return "";
  const size_t next = help.find("\n  [", section + 1);
  const size_t at = help.find("\n    " + k.name + " ", section);
  if (at == std::string::npos || at > next) return "";
  return help.substr(at + 1, help.find('\n', at + 1) - at - 1);
}

// A value the key accepts: its default, else (no fixed default) what the tiny deck resolves it to.
std::string good_value(const DeckKey& k) {
  if (!k.default_toml.empty()) return k.default_toml;
  const harness::TomlNode t = resolved();
  const harness::TomlNode* n = at(t, k);
  return n ? harness::format_toml(*n) : "";
}

// A value of another type than the key's: a string for a numeric key, an integer otherwise.
std::string wrong_value(const DeckKey& k) {
  const bool numeric = k.type == KeyType::Integer || k.type == KeyType::Number || k.type == KeyType::Integers;
  return numeric ? "\"x\"" : "7";
}

std::string usage_error(const std::vector<std::string>& sets) {
  try {
    tiny(sets);
  } catch (const minicp::harness::UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

}  // namespace

TEST(DeckKeys, EveryKeyIsInTheHelpWithItsDefault) {
  for (const DeckKey& k : run::deck_keys()) {
    const std::string line = help_line(k);
    ASSERT_FALSE(line.empty()) << k.id() << " is not in --help:\n" << run::deck_keys_help();
    const std::string def = k.default_toml.empty() ? k.default_note : k.default_toml;
    EXPECT_NE(line.find("(default: " + def), std::string::npos) << k.id() << ": " << line;
    for (const std::string& c : k.choices) EXPECT_NE(line.find(c), std::string::npos) << k.id() << ": " << c;
  }
}

TEST(DeckKeys, HelpNamesThePresetsOfTheModel) {
  const std::string help = run::deck_keys_help();
  for (const minicp::model::Preset& p : minicp::model::presets())
    EXPECT_NE(help.find(p.name), std::string::npos) << p.name;
}

TEST(DeckKeys, EveryKeyAcceptsItsDefault) {
  for (const DeckKey& k : run::deck_keys()) {
    const std::string v = good_value(k);
    ASSERT_FALSE(v.empty()) << k.id() << ": no default and not in the tiny deck's resolved deck";
    EXPECT_NO_THROW(tiny({k.id() + "=" + v}))
        << "--set " << k.id() << "=" << v << ": " << usage_error({k.id() + "=" + v});
  }
}

TEST(DeckKeys, EveryKeyRefusesAnotherType) {
  for (const DeckKey& k : run::deck_keys()) {
    const std::string msg = usage_error({k.id() + "=" + wrong_value(k)});
    EXPECT_EQ(msg.rfind(k.id() + ": expected a", 0), 0u) << k.id() << "=" << wrong_value(k) << ": " << msg;
  }
}

// --set overrides: spaces around '=' and '.' are allowed; a line break (which TOML would read
// as a second key, silently dropped), a key given twice, and a value that is not TOML where
// the key takes numbers are refused, each naming the override.
TEST(DeckSets, SpacesAroundTheSignsAreAllowed) {
  EXPECT_EQ(tiny({"run.reps = 3"}).reps, 3);
  EXPECT_EQ(tiny({" run . reps=4 "}).reps, 4);
}

TEST(DeckSets, ALineBreakIsRefused) {
  EXPECT_EQ(usage_error({"run.reps=1\nbogus=1"}),
            "--set run.reps=1\nbogus=1: holds a line break; give one key=value per --set");
}

TEST(DeckSets, AKeyGivenTwiceIsRefused) {
  EXPECT_EQ(usage_error({"run.reps=1", "run.reps = 2"}),
            "--set run.reps = 2: run.reps is set twice (also --set run.reps=1); give each key once");
}

TEST(DeckSets, ANumberThatIsNotTomlIsNamedSo) {
  EXPECT_EQ(usage_error({"run.reps=1 2"}),
            "--set run.reps=1 2: 1 2 is not a TOML value; run.reps takes an integer (e.g. run.reps=5)");
  EXPECT_EQ(usage_error({"sweep.seq_len=64 128"}),
            "--set sweep.seq_len=64 128: 64 128 is not a TOML value; sweep.seq_len takes an integer or an array of "
            "them (e.g. sweep.seq_len=[64, 128])");
  // An integer TOML cannot hold is out of range, alone or in an array.
  EXPECT_NE(usage_error({"run.seed=99999999999999999999"}).find("integer out of range"), std::string::npos);
  EXPECT_NE(usage_error({"sweep.seq_len=[64, 99999999999999999999]"}).find("integer out of range"), std::string::npos);
  // A bare word is still a string for a string key.
  EXPECT_EQ(tiny({"run.pass=train"}).passes.size(), 1u);
}

TEST(DeckKeys, EveryKeyIsInTheResolvedDeckUnlessLeftOut) {
  for (const DeckKey& k : run::deck_keys()) {
    switch (k.resolved) {
      case run::InResolved::Always: EXPECT_TRUE(in_resolved(k, {})) << k.id(); break;
      case run::InResolved::Never: EXPECT_FALSE(in_resolved(k, {k.id() + "=" + good_value(k)})) << k.id(); break;
      case run::InResolved::WhenSet: {
        // Only a string can be "not set" (empty); a set one is in the resolved deck.
        ASSERT_TRUE(k.type == KeyType::Text || k.type == KeyType::Choice) << k.id();
        const std::string set = k.choices.empty() ? "\"x\"" : "\"" + k.choices.front() + "\"";
        EXPECT_TRUE(in_resolved(k, {k.id() + "=" + set})) << k.id();
        if (k.default_toml == "\"\"") {
          EXPECT_FALSE(in_resolved(k, {k.id() + "=\"\""})) << k.id();
        }
        break;
      }
    }
  }
}

TEST(DeckKeys, CaseAttributesAreSingleValues) {
  const run::Deck d = tiny();
  for (const DeckKey& k : run::deck_keys()) {
    if (!k.case_attr) continue;
    const run::KeyValue v = k.get(d);
    EXPECT_TRUE(std::holds_alternative<int64_t>(v) || std::holds_alternative<double>(v) ||
                std::holds_alternative<std::string>(v))
        << k.id() << ": a list is the sweep's, one value per case";
  }
}

TEST(DeckKeys, FabricIsReadAndResolvedOnlyWhenSet) {
  const run::Deck plain = tiny();
  EXPECT_EQ(plain.fabric, "");
  EXPECT_EQ(plain.resolved.find("fabric"), std::string::npos);
  const run::Deck set = tiny({"run.fabric=\"eth-10g\""});
  EXPECT_EQ(set.fabric, "eth-10g");
  const harness::TomlNode* fabric = harness::parse_toml(set.resolved).get("run")->get("fabric");
  ASSERT_NE(fabric, nullptr);
  EXPECT_EQ(fabric->string, "eth-10g");
  EXPECT_EQ(usage_error({"run.fabric=1"}), "run.fabric: expected a string, got an integer");
}

// The rows' defaults are the deck's when it leaves the keys out.
TEST(DeckKeys, DefaultsFillTheDeck) {
  const run::Deck d = run::load_deck("", {"model.preset=\"tiny\"", "sweep.seq_len=64"}, 2);
  EXPECT_EQ(d.reps, 3);
  EXPECT_EQ(d.warmup, 1);
  EXPECT_EQ(d.dtype, "f32");
  EXPECT_EQ(d.mask, "causal");
  EXPECT_EQ(d.progress, "thread");
  EXPECT_EQ(d.seed, 1u);
  EXPECT_EQ(d.stall_timeout_s, 600);
  ASSERT_EQ(d.passes.size(), 1u);
  EXPECT_EQ(d.passes[0], minicp::model::Pass::Train);
  ASSERT_EQ(d.modes.size(), 1u);
  EXPECT_EQ(d.modes[0], minicp::cp::Mode::Full);
  EXPECT_EQ(d.ranks, std::vector<int>{2});
  EXPECT_TRUE(d.all_schemes);
  for (const minicp::cp::Setting& st : minicp::cp::all_settings())
    EXPECT_EQ(d.settings.at(st.name), std::vector<int>{st.default_value}) << st.name;
}

// decode_tokens is a size of the decode problem: every decode case (the reference among them)
// runs each value, named in its id, and the train pass runs once; a scheme's own setting
// multiplies only that scheme's cases.
TEST(Deck, DecodeTokensSweepEveryDecodeCaseAndSettingsOnlyTheirScheme) {
  const std::vector<run::Case> cases =
      run::make_cases(tiny({"sweep.ranks=[2]", "sweep.seq_len=[64]", "sweep.schemes=[\"none\",\"tree\",\"allgather\"]",
                            "run.pass=[\"train\",\"decode\"]", "sweep.decode_tokens=[2,4]", "sweep.chunks=[2,4]"}));
  std::vector<std::string> ids;
  for (const run::Case& c : cases) ids.push_back(c.id);
  const std::vector<std::string> want = {"000_train_none_S64_P1",
                                         "001_train_allgather_S64_P2_chunks2",
                                         "002_train_allgather_S64_P2_chunks4",
                                         "003_decode_none_S64_P1_decode_tokens2",
                                         "004_decode_none_S64_P1_decode_tokens4",
                                         "005_decode_tree_S64_P2_decode_tokens2",
                                         "006_decode_tree_S64_P2_decode_tokens4"};
  EXPECT_EQ(ids, want);
  for (const run::Case& c : cases) {
    EXPECT_EQ(c.stack.attn.decode_tokens, c.id.find("decode_tokens4") != std::string::npos ? 4 : 2) << c.id;
    EXPECT_EQ(c.stack.attn.setting("chunks"), c.id.find("chunks4") != std::string::npos ? 4 : 2) << c.id;
    EXPECT_EQ(c.stack.attn.problem == minicp::cp::Problem::Decode, c.stack.pass == minicp::model::Pass::Decode) << c.id;
  }
  EXPECT_NE(run::none_key(cases[3]), run::none_key(cases[4]));  // each decode size its own reference
  EXPECT_EQ(run::none_key(cases[3]), run::none_key(cases[5]));
}

// sweep.documents: every item at every seq_len makes its own cases, whose mask holds lengths
// summing to S (the list cut at S, the mix filled to it), the mix the same for one seed and
// another for another; each packing has its own `none` reference and case id.
TEST(Deck, DocumentsEachItemAtEachLengthItsOwnCases) {
  const std::vector<std::string> sets = {"run.mask=\"documents\"",
                                         "run.pass=\"train\"",
                                         "sweep.ranks=[2]",
                                         "sweep.seq_len=[300,1000]",
                                         "sweep.schemes=[\"none\",\"zigzag\"]",
                                         "sweep.documents=[\"outlier\", [1, 37, 900, 100]]"};
  const std::vector<run::Case> cases = run::make_cases(tiny(sets));
  ASSERT_EQ(cases.size(), 8u);  // 2 lengths x 2 items x (none, zigzag)
  EXPECT_EQ(cases[0].id, "000_train_none_S300_P1_docsoutlier");
  EXPECT_EQ(cases[3].id, "003_train_zigzag_S300_P2_docslist1");
  for (const run::Case& c : cases) {
    const std::vector<int64_t> len = c.stack.attn.mask.doc_lengths(c.stack.attn.seq_len);
    int64_t sum = 0;
    for (int64_t l : len) {
      sum += l;
      EXPECT_GE(l, 1) << c.id;
    }
    EXPECT_EQ(sum, c.stack.attn.seq_len) << c.id;
    const std::vector<int64_t> cut_300 = {1, 37, 262}, cut_1000 = {1, 37, 900, 62};
    if (c.documents_label == "list1") {
      EXPECT_EQ(len, c.stack.attn.seq_len == 300 ? cut_300 : cut_1000) << c.id;
    }
    if (c.documents_label == "outlier") {
      EXPECT_EQ(len.front(), c.stack.attn.seq_len / 2) << c.id;
    }
  }
  EXPECT_EQ(run::none_key(cases[1]), run::none_key(cases[0]));
  EXPECT_NE(run::none_key(cases[2]), run::none_key(cases[0]));  // another packing, another reference
  // A mix: the same documents for one seed, others for another; the first is half of S.
  auto outlier = [](uint64_t seed) { return run::document_lengths("outlier", 100000, seed, "sweep.documents"); };
  EXPECT_EQ(outlier(1), outlier(1));
  EXPECT_NE(outlier(1), outlier(2));
  EXPECT_EQ(outlier(1).front(), 50000);
  EXPECT_GT(outlier(1).size(), 25u);  // the rest in documents of 256 to 2048 tokens
}

// sweep.dispatch: the ring family runs each listed dispatch on the tokens it places; a scheme
// that takes none runs its layout only, `none` once; a case's id and config name the dispatch.
TEST(Deck, DispatchRunsOnTheSchemesThatTakeOne) {
  const std::vector<run::Case> cases =
      run::make_cases(tiny({"run.mask=\"documents\"", "run.pass=\"train\"", "sweep.ranks=[2]", "sweep.seq_len=[96]",
                            "sweep.schemes=[\"none\",\"zigzag\",\"doublering\"]", "sweep.documents=[[40, 1, 55]]",
                            "sweep.dispatch=[\"layout\",\"area\"]", "run.dispatch_chunk=8"}));
  std::vector<std::string> ids;
  for (const run::Case& c : cases) ids.push_back(c.id);
  const std::vector<std::string> want = {"000_train_none_S96_P1_docslist0", "001_train_zigzag_S96_P2_docslist0",
                                         "002_train_zigzag_S96_P2_docslist0_dispatcharea",
                                         "003_train_doublering_S96_P2_docslist0_inner_ring0"};
  EXPECT_EQ(ids, want);
  ASSERT_EQ(cases.size(), want.size());
  const minicp::cp::Config& a = cases[2].stack.attn;
  EXPECT_EQ(a.dispatch, "area");
  ASSERT_TRUE(a.tokens);
  EXPECT_EQ((*a.tokens)[0].size() + (*a.tokens)[1].size(), 96u);
  EXPECT_FALSE(cases[1].stack.attn.tokens);
  try {  // a named scheme that takes no dispatch, none listed that it runs
    run::make_cases(tiny({"sweep.ranks=[2]", "sweep.seq_len=[64]", "sweep.schemes=[\"doublering\"]",
                          "run.pass=\"train\"", "sweep.dispatch=[\"area\"]"}));
    ADD_FAILURE() << "doublering with only a dispatch must be refused";
  } catch (const harness::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("doublering takes no dispatch (sweep.dispatch \"area\")"), std::string::npos)
        << e.what();
  }
}

// A sweep of several dispatches crosses each with every scheme that takes one: a combination
// the scheme cannot run (ulysses on doc-zigzag's unequal counts) is listed refused, not fatal;
// the same dispatch named alone is the user's request, and refused before anything runs.
TEST(Deck, CrossedDispatchTheSchemeCannotRunIsListedRefused) {
  const std::vector<std::string> sets = {
      "run.mask=\"documents\"", "run.pass=\"train\"",          "sweep.ranks=[2]",
      "sweep.seq_len=[96]",     "sweep.schemes=[\"ulysses\"]", "sweep.documents=[[1, 2, 93]]"};
  auto with = [&](const std::string& dispatch) {
    std::vector<std::string> v = sets;
    v.push_back("sweep.dispatch=" + dispatch);
    return tiny(v);
  };
  const std::vector<run::Case> cases = run::make_cases(with("[\"layout\", \"doc-zigzag\", \"contiguous\"]"));
  ASSERT_EQ(cases.size(), 3u);
  EXPECT_TRUE(cases[0].refused.empty()) << cases[0].refused;
  EXPECT_EQ(cases[1].refused,
            "ulysses needs equal tokens on every rank; dispatch doc-zigzag gives 47 to 49 over 2 ranks");
  EXPECT_TRUE(cases[2].refused.empty()) << cases[2].refused;
  EXPECT_THROW(run::make_cases(with("[\"doc-zigzag\"]")), harness::UsageError);
}

// A lengths file over 64 MiB is refused before it is read (a sparse file: no disk used).
TEST(Deck, DocumentsFileOverTheLimitIsRefused) {
  const std::string path = testing::TempDir() + "minicp_huge_lengths.txt";
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(ftruncate(fileno(f), (int64_t(64) << 20) + 1), 0);
  std::fclose(f);
  try {
    tiny({"run.mask=\"documents\"", "sweep.seq_len=[64]", "sweep.documents=[\"" + path + "\"]"});
    ADD_FAILURE() << "a lengths file over 64 MiB must be refused";
  } catch (const harness::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("more than a lengths file ever has (at most 64.0 MiB)"), std::string::npos)
        << e.what();
  }
  std::remove(path.c_str());
}

// The ranks end a step within nanoseconds of each other, so two can read the same step time
// while their attention takes different parts of it; the figures take the lowest such rank,
// as tests/check_results.py does when it recomputes them from the file.
TEST(Figures, EqualStepTimesTakeTheLowestRank) {
  const std::vector<run::Case> cases = run::make_cases(tiny({"sweep.ranks=[2]", "sweep.schemes=[\"ring\"]"}));
  ASSERT_FALSE(cases.empty());
  const run::Case& c = cases.front();
  run::CaseResult m;
  m.bytes = m.attn_bytes = {1e6, 1e6};
  m.grad_bytes = m.tp_bytes = {0, 0};
  m.compute = m.exec_flops = {1, 1};
  const double ms = 1e-3;
  for (int rep = 0; rep < 3; ++rep) {
    const double jitter = 0.1 * ms * rep;
    // mode, rep, rank, forward, backward, step, phases, attn, attn wait, grad, grad busy
    m.steps.push_back({0, rep, 0, 4 * ms, 6 * ms + jitter, 10 * ms + jitter, 10 * ms + jitter, 6 * ms, 0, 0, 0, 0});
    m.steps.push_back({0, rep, 1, 4 * ms, 6 * ms + jitter, 10 * ms + jitter, 10 * ms + jitter, 2 * ms, 0, 0, 0, 0});
    m.steps.push_back({1, rep, 0, 3 * ms, 5 * ms, 8 * ms, 8 * ms, 5 * ms, 0, 0, 0, 0});
    m.steps.push_back({1, rep, 1, 3 * ms, 4 * ms, 7 * ms, 7 * ms, 1 * ms, 0, 0, 0, 0});
    m.steps.push_back({2, rep, 0, 1 * ms, 3 * ms, 4 * ms, 4 * ms, 4 * ms, 0, 0, 0, 0});
    m.steps.push_back({2, rep, 1, 1 * ms, 2 * ms, 3 * ms, 3 * ms, 3 * ms, 0, 0, 0, 0});
  }
  const minicp::record::Attrs s = run::figures(c, m, {}, 1);
  // Rank 0's attention: 6 ms in full mode, 5 ms compute-only, 4 ms comm-only.
  EXPECT_NEAR(s.real.at("attn_overlap"), 1.0 - (6.0 - 5.0) / 4.0, 1e-9);
  EXPECT_NEAR(s.real.at("measured_time_s"), 10.1 * ms, 1e-12);
}
