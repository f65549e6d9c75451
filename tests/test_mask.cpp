// The mask value (miniapp/cp/mask.hpp) against the rules written out here from their
// definitions: which keys each kind shows a query, the documents of listed lengths found by
// walking the lengths, the conservative fully_masked test, and the refusals of a MaskSpec.
#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "miniapp/cp/mask.hpp"

using minicp::cp::Mask;
using minicp::cp::MaskSpec;

namespace {

// The document of pos under listed lengths, by walking them (past their sum: the last).
int64_t walk_doc(const std::vector<int64_t>& lengths, int64_t pos) {
  int64_t end = 0;
  for (size_t d = 0; d < lengths.size(); ++d) {
    end += lengths[d];
    if (pos < end) return int64_t(d);
  }
  return int64_t(lengths.size()) - 1;
}

// Key k visible from query q under each kind, from its definition.
bool rule(const std::string& kind, int64_t W, int64_t L, const std::vector<int64_t>& lengths, int64_t q, int64_t k) {
  if (kind == "full") return true;
  if (k > q) return false;
  if (kind == "window") return k > q - W;
  if (kind == "documents") return L > 0 ? q / L == k / L : walk_doc(lengths, q) == walk_doc(lengths, k);
  return true;
}

}  // namespace

TEST(Mask, EachKindShowsTheKeysOfItsDefinition) {
  const std::vector<int64_t> lengths = {1, 7, 2, 30, 1, 1, 20};  // sum 62
  struct Case {
    Mask mask;
    std::string kind;
    int64_t W, L;
  };
  const Case cases[] = {{Mask::causal(), "causal", 0, 0},
                        {Mask::full(), "full", 0, 0},
                        {Mask::window(5), "window", 5, 0},
                        {Mask::equal_documents(9), "documents", 0, 9},
                        {Mask::documents(lengths), "documents", 0, 0}};
  for (const Case& c : cases) {
    EXPECT_EQ(c.mask.name(), c.kind);
    for (int64_t q = 0; q < 70; ++q) {  // past the lengths' sum too (a decode's new tokens)
      const auto [lo, hi] = c.mask.keys_of(q);
      for (int64_t k = 0; k < 70; ++k) {
        const bool want = rule(c.kind, c.W, c.L, lengths, q, k);
        ASSERT_EQ(c.mask.visible(q, k), want) << c.mask.describe() << " q " << q << " k " << k;
        ASSERT_EQ(k >= lo && k <= hi, want) << c.mask.describe() << " keys_of(" << q << ")";
      }
    }
  }
  for (int64_t pos = 0; pos < 70; ++pos) EXPECT_EQ(Mask::documents(lengths).doc_of(pos), walk_doc(lengths, pos));
  // The closed-form area against the pairs counted one by one, at lengths inside and past the
  // window, the documents' period and the lengths' sum.
  for (const Case& c : cases)
    for (int64_t S : {1, 5, 9, 40, 62, 70}) {
      double pairs = 0;
      for (int64_t q = 0; q < S; ++q)
        for (int64_t k = 0; k < S; ++k) pairs += rule(c.kind, c.W, c.L, lengths, q, k) ? 1 : 0;
      EXPECT_EQ(c.mask.area(S), pairs) << c.mask.describe() << " S=" << S;
    }
}

// fully_masked may say "no" when nothing is seen, never "yes" when something is.
TEST(Mask, FullyMaskedNeverHidesAVisiblePair) {
  std::mt19937_64 g(7);
  auto U = [&](int64_t a, int64_t b) { return std::uniform_int_distribution<int64_t>(a, b)(g); };
  const Mask masks[] = {Mask::causal(), Mask::full(), Mask::window(4), Mask::equal_documents(6),
                        Mask::documents({1, 3, 11, 2, 2, 9, 1})};
  int said_masked = 0;
  for (const Mask& m : masks)
    for (int it = 0; it < 2000; ++it) {
      const int64_t q0 = U(0, 40), q1 = q0 + U(0, 6), k0 = U(0, 40), k1 = k0 + U(0, 6);
      bool seen = false;
      for (int64_t q = q0; q <= q1; ++q)
        for (int64_t k = k0; k <= k1; ++k) seen |= m.visible(q, k);
      const bool masked = m.fully_masked(q0, q1, k0, k1);
      said_masked += masked;
      ASSERT_FALSE(masked && seen) << m.describe() << " q [" << q0 << "," << q1 << "] k [" << k0 << "," << k1 << "]";
    }
  EXPECT_GT(said_masked, 1000) << "the test must exercise masked blocks";
}

TEST(Mask, SpecsAreCheckedNamingTheCallersKeys) {
  const minicp::cp::MaskNames deck{"run.mask", "run.window", "run.doc_len", "sweep.documents"};
  EXPECT_EQ(Mask::problem({"causal", 0, 0}, deck), "");
  EXPECT_EQ(Mask::problem({"sliding", 0, 0}, deck),
            "run.mask = \"sliding\": not one of causal, full, window, documents");
  EXPECT_EQ(Mask::problem({"window", 0, 0}, deck), "run.window: needs a value >= 1 with run.mask = \"window\"");
  EXPECT_EQ(Mask::problem({"causal", 0, 8}, deck), "run.doc_len = 8: only with run.mask = \"documents\"");
  EXPECT_EQ(Mask::from(MaskSpec{"documents", 0, 16}).describe(), "documents of 16");
  EXPECT_EQ(Mask::from(MaskSpec{"window", 64, 0}).describe(), "window 64");
  EXPECT_THROW(Mask::from(MaskSpec{"full", 3, 0}), std::invalid_argument);
  EXPECT_THROW(Mask::documents({4, 0, 2}), std::invalid_argument);
  EXPECT_THROW(Mask::documents({}), std::invalid_argument);
}

TEST(Mask, ExamplesAreOnePerKindInTheirOrder) {
  const std::vector<Mask> ex = Mask::examples(64);
  ASSERT_EQ(ex.size(), Mask::kind_names().size());
  for (size_t i = 0; i < ex.size(); ++i) EXPECT_EQ(ex[i].name(), Mask::kind_names()[i]);
}
