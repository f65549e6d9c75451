// The dispatches (miniapp/cp/dispatch.hpp): every token on exactly one rank for any length,
// rank count and documents; tokens per rank as each promises; the sequence-level ones equal to
// the schemes' layouts; and on a packed sequence with one long document the area dispatch
// balances the mask's area where the sequence-level zigzag does not.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "miniapp/cp/dispatch.hpp"
#include "miniapp/cp/layout.hpp"

using minicp::cp::Dispatch;
using minicp::cp::Mask;

namespace {

// Max over mean of the ranks' areas (their own queries against the whole sequence).
double area_imbalance(const std::vector<std::vector<int64_t>>& ranks, const Mask& m, int64_t S) {
  double most = 0, sum = 0;
  for (const auto& r : ranks) {
    const double a = minicp::cp::mask_area(m, r, S);
    most = std::max(most, a), sum += a;
  }
  return most / (sum / double(ranks.size()));
}

// One document of half the sequence, then documents of 1 to 700 tokens (a fixed pattern).
Mask outlier(int64_t S) {
  std::vector<int64_t> lengths = {std::max<int64_t>(1, S / 2)};
  for (int64_t at = lengths[0], i = 0; at < S; ++i)
    lengths.push_back(std::min<int64_t>(1 + (i * 389) % 700, S - at)), at += lengths.back();
  return Mask::documents(lengths);
}

}  // namespace

TEST(Dispatch, EveryTokenOnExactlyOneRank) {
  for (const std::string& name : Dispatch::names())
    for (int64_t S : {1, 7, 96, 100, 1001})
      for (int P : {1, 2, 3, 4, 8})
        for (const Mask& m : {Mask::causal(), Mask::documents({1, 37, 5, 20, 3, 30}), outlier(S)}) {
          const auto ranks = minicp::cp::dispatch_tokens(Dispatch::parse(name, 16), m, S, P);
          ASSERT_EQ(ranks.size(), size_t(P));
          std::vector<int64_t> all;
          for (const auto& r : ranks) {
            EXPECT_TRUE(std::is_sorted(r.begin(), r.end())) << name;
            all.insert(all.end(), r.begin(), r.end());
          }
          std::sort(all.begin(), all.end());
          std::vector<int64_t> want(static_cast<size_t>(S));
          for (int64_t t = 0; t < S; ++t) want[size_t(t)] = t;
          ASSERT_EQ(all, want) << name << " S=" << S << " P=" << P << " " << m.describe();
          size_t lo = SIZE_MAX, hi = 0;
          for (const auto& r : ranks) lo = std::min(lo, r.size()), hi = std::max(hi, r.size());
          // Near-equal tokens: by one token a cut (zigzag: two cuts), by one chunk (area);
          // doc-zigzag promises it per document only.
          const size_t slack = name == "area" ? 16 : name == "zigzag" ? 2 : name == "doc-zigzag" ? SIZE_MAX : 1;
          if (slack != SIZE_MAX) {
            EXPECT_LE(hi - lo, slack) << name << " S=" << S << " P=" << P;
          }
        }
}

TEST(Dispatch, SequenceLevelOnesAreTheLayouts) {
  for (int P : {1, 2, 4}) {
    const int64_t S = 96;
    const auto z = minicp::cp::dispatch_tokens(Dispatch::parse("zigzag"), Mask::causal(), S, P);
    const auto c = minicp::cp::dispatch_tokens(Dispatch::parse("contiguous"), Mask::causal(), S, P);
    const auto s = minicp::cp::dispatch_tokens(Dispatch::parse("striped"), Mask::causal(), S, P);
    for (int r = 0; r < P; ++r) {
      std::vector<int64_t> zl = minicp::layout::zigzag(S, P, r);
      std::sort(zl.begin(), zl.end());
      EXPECT_EQ(z[size_t(r)], zl);
      EXPECT_EQ(c[size_t(r)], minicp::layout::contiguous(S, P, r));
      EXPECT_EQ(s[size_t(r)], minicp::layout::striped(S, P, r));
    }
  }
}

// The outlier packing at P = 4 and 64: area <= 1.05; sequence zigzag far above it.
TEST(Dispatch, AreaBalancesAPackedSequence) {
  const int64_t S = 65536;
  const Mask m = outlier(S);
  for (int P : {4, 64}) {
    const double zigzag = area_imbalance(minicp::cp::dispatch_tokens(Dispatch::parse("zigzag"), m, S, P), m, S);
    const double area = area_imbalance(minicp::cp::dispatch_tokens(Dispatch::parse("area", 64), m, S, P), m, S);
    const double doc = area_imbalance(minicp::cp::dispatch_tokens(Dispatch::parse("doc-zigzag"), m, S, P), m, S);
    EXPECT_LE(area, 1.05) << "P=" << P;
    EXPECT_GT(zigzag, 1.2) << "P=" << P;
    EXPECT_LE(doc, zigzag) << "P=" << P;
  }
  // One causal document: sequence zigzag is balanced already.
  EXPECT_LT(
      area_imbalance(minicp::cp::dispatch_tokens(Dispatch::parse("zigzag"), Mask::causal(), S, 8), Mask::causal(), S),
      1.001);
}

TEST(Dispatch, NamesAreChecked) {
  EXPECT_THROW(Dispatch::parse("spiral"), std::invalid_argument);
  EXPECT_THROW(Dispatch::parse("area", 0), std::invalid_argument);
  EXPECT_STREQ(Dispatch::parse("doc-zigzag").name(), "doc-zigzag");
}
