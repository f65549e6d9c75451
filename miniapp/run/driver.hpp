// The minicp driver: parse (command line -> deck -> cases, with every check before any work)
// and execute (each case: build the layer stack on its CP group, time its reps, print its
// table, dump the first case). miniapp/main.cpp only wires these into harness::main.
#pragma once
#include <string>
#include <vector>

#include "harness/main.hpp"
#include "miniapp/run/deck.hpp"

namespace minicp::run {

struct Options {
  std::string deck;
  std::vector<std::string> sets;
  std::string out, dump, resume;
  bool dry_run = false, quiet = false, list_schemes = false, no_events = false;
};

struct Plan {
  Options o;
  Deck deck;
  std::vector<Case> cases;
  std::vector<int64_t> predicted_bytes;  // per case, per rank (the memory model)
  int local_ranks = 1;                   // ranks of the job on this node
};

// Throws harness::UsageError on bad input; prints and throws harness::HelpShown for --help,
// --list-schemes and --dry-run (which refuses, with UsageError, a case that would not fit).
Plan parse(const harness::Args& a);
int execute(const harness::Args& a, const Plan& p);

// The registry, for --list-schemes: name, problems, summary, settings, refusals.
std::string scheme_list();

}  // namespace minicp::run
