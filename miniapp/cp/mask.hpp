// The attention mask of a problem: which key positions each query position sees. One value
// that every part reads (the schemes' kernel masks and skipped blocks, the model's tile
// bounds, the deck, the case record, the dump), so a mask kind is defined here alone.
//
// Every kind is causal except `full`, and for every kind the keys a query sees form one
// interval of positions (keys_of): the dump records those intervals, so its checker needs no
// rule of its own. Documents are held as their start offsets (any lengths: a 1-token
// document, one shorter than a tile, one over every rank), or for documents of one length
// (equal_documents) by that length alone, so a sequence of 2^36 tokens costs nothing to describe.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace minicp::cp {

// A mask as a user asks for it: a kind by name and its sizes, each given with its kind only.
struct MaskSpec {
  std::string kind = "causal";
  int64_t window = 0, doc_len = 0;
  bool listed = false;  // documents of listed lengths, given apart (Mask::documents), not doc_len
};
// How the caller names each part of a MaskSpec in messages ("run.mask", "--window", ...).
struct MaskNames {
  std::string kind, window, doc_len, listed;
};

class Mask {
 public:
  enum class Kind { Causal, Full, Window, Documents };

  // The kinds by name, in the order --help and the deck list them.
  static const std::vector<std::string>& kind_names();
  static Kind parse_kind(const std::string& name);  // throws std::invalid_argument naming the allowed ones

  Mask() = default;  // causal
  static Mask causal() { return Mask(); }
  static Mask full();
  static Mask window(int64_t tokens);  // a query sees itself and the tokens-1 keys before it (tokens >= 1)
  // Documents of `len` tokens each at every position (len >= 1): the last is cut wherever
  // the sequence ends, and a decode's new tokens go on in the same rhythm.
  static Mask equal_documents(int64_t len);
  // Documents of these lengths in order (each >= 1); positions past their sum belong to the
  // last one (a decode's new tokens extend the last document).
  static Mask documents(const std::vector<int64_t>& lengths);
  // "" when spec makes a mask, else one sentence naming the part (by `names`), its value and
  // what is allowed.
  static std::string problem(const MaskSpec& spec, const MaskNames& names);
  // Throws std::invalid_argument where problem() is not "" and for listed documents (which
  // need their lengths: Mask::documents).
  static Mask from(const MaskSpec& spec);

  // One mask of each kind at sequence length S, in kind_names() order, for tables that sweep
  // the kinds (minicp-fidelity): a window of S/4 tokens, documents of S/4 tokens.
  static std::vector<Mask> examples(int64_t seq_len);

  Kind kind() const { return kind_; }
  const char* name() const;      // "causal", "full", "window", "documents"
  std::string describe() const;  // the name with its size: "window 64", "documents of 512", "documents (7)"
  bool is_causal() const { return kind_ != Kind::Full; }
  int64_t window() const { return window_; }  // 0 unless Window
  bool has_documents() const { return kind_ == Kind::Documents; }
  // The length of every document of equal_documents (0 otherwise).
  int64_t doc_period() const { return period_; }
  // The documents' start offsets (first 0) of documents(lengths); empty otherwise.
  const std::vector<int64_t>& doc_starts() const;
  // The documents' lengths over positions [0, S): listed documents as listed (the last up to
  // S), documents of one length each, one document of S without documents (a vector of them:
  // for a huge S of short equal documents, count them with doc_period instead).
  std::vector<int64_t> doc_lengths(int64_t S) const;

  // The visible (query, key) pairs of queries 0..S-1 against keys 0..S-1, in closed form
  // (documents: over their lengths): the mask's area, what attention's useful FLOPs count.
  double area(int64_t S) const;

  // The document of position pos (0 without documents).
  int64_t doc_of(int64_t pos) const;
  // [first, last] key positions query position q sees (last = INT64_MAX for `full`: every key).
  std::pair<int64_t, int64_t> keys_of(int64_t q) const;
  bool visible(int64_t q, int64_t k) const {
    const auto [lo, hi] = keys_of(q);
    return k >= lo && k <= hi;
  }
  // True when no query of positions [qmin, qmax] sees a key of [kmin, kmax] (conservative:
  // false may still mean nothing is seen, never the reverse).
  bool fully_masked(int64_t qmin, int64_t qmax, int64_t kmin, int64_t kmax) const;

 private:
  Mask(Kind kind, int64_t window, int64_t period) : kind_(kind), window_(window), period_(period) {}
  Kind kind_ = Kind::Causal;
  int64_t window_ = 0, period_ = 0;
  std::shared_ptr<const std::vector<int64_t>> starts_;  // shared: a Config is copied per case and call
};

}  // namespace minicp::cp
