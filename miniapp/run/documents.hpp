// Packed documents (sweep.documents): how a case's sequence is cut into documents of any
// lengths. An item is one of
//   a mix's name    "outlier": drawn from inputs/documents/<name>.toml (or $MINICP_DOCUMENTS),
//                   seeded by run.seed, filling any seq_len (the last document cut at S);
//   a lengths file  "lens/a.txt": a path (it holds '/' or '.'), one length a line, '#' comments;
//   a lengths list  "[1, 37, 900]" (in the deck: the array itself).
// A file's or a list's lengths must reach S; the documents past S are dropped and the one
// across S is cut. Every length is >= 1: a 1-token document, one shorter than a tile, one
// over every rank are all allowed, with no divisibility rule.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace minicp::run {

// A named mix: documents drawn one after another until S is filled. `first_share` of S
// goes to one document first (0: none); then each document picks a bin by its weight and a
// length in it, uniformly.
struct Mix {
  std::string name, path, help;
  double first_share = 0;
  std::vector<std::pair<int64_t, int64_t>> bins;  // [shortest, longest] tokens
  std::vector<double> weights;                    // (bins) > 0
};

// Where the mixes live (MINICP_DOCUMENTS, else the source tree's inputs/documents), and their
// names (the file names without .toml), sorted.
std::string documents_dir();
std::vector<std::string> mix_names();
// Reads a mix; throws harness::UsageError naming the file and the key that is wrong.
Mix read_mix(const std::string& name);
// minicp --list-mixes: one line each (name, help, file), or as a JSON array.
std::string mixes_text();
std::string mixes_json(int indent = -1);

// The lengths of an item's documents at sequence length S (they sum to S). `key` names the
// deck key in messages. Throws harness::UsageError: an unknown mix, a file that is not
// lengths (or over 64 MiB), a length < 1, lengths that do not reach S.
std::vector<int64_t> document_lengths(const std::string& item, int64_t S, uint64_t seed, const std::string& key);
// The item in a case id: the mix's name, a file's stem, or "list<index>" (index: the item's
// place in sweep.documents).
std::string documents_label(const std::string& item, size_t index);

}  // namespace minicp::run
