// The tp x cp x dp mesh (comm/mesh.hpp): a hand-written 2 x 2 x 2 layout in Megatron's order,
// and for every order and sizes up to 3 per axis, that coordinates and ranks are one map, that
// each axis's groups partition the ranks and hold the ranks that differ on that axis only,
// and that the colors tell the groups apart.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/mesh.hpp"

using minicp::comm::Axis;
using minicp::comm::Mesh;

namespace {

const Axis kAxes[] = {Axis::TP, Axis::CP, Axis::DP};

TEST(Mesh, MegatronOrderByHand) {
  const Mesh m(2, 2, 2);  // tp-cp-dp: rank = t + 2 c + 4 d
  EXPECT_EQ(m.order(), "tp-cp-dp");
  EXPECT_EQ(m.ranks(), 8);
  EXPECT_EQ(m.group(5, Axis::TP), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.group(5, Axis::CP), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.group(5, Axis::DP), (std::vector<int>{1, 5}));
  EXPECT_EQ(m.grad_group(5), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(m.rank_at(1, 0, 1), 5);
  EXPECT_EQ(m.coord(6, Axis::TP), 0);
  EXPECT_EQ(m.coord(6, Axis::CP), 1);
  EXPECT_EQ(m.coord(6, Axis::DP), 1);
  const Mesh cp_inner(2, 2, 2, "cp-tp-dp");  // rank = c + 2 t + 4 d: CP consecutive
  EXPECT_EQ(cp_inner.group(5, Axis::CP), (std::vector<int>{4, 5}));
  EXPECT_EQ(cp_inner.group(5, Axis::TP), (std::vector<int>{5, 7}));
}

TEST(Mesh, EveryOrderIsOneMapWithPartitioningGroups) {
  int checked = 0;
  for (const std::string& order : Mesh::orders())
    for (int tp = 1; tp <= 3; ++tp)
      for (int cp = 1; cp <= 3; ++cp)
        for (int dp = 1; dp <= 3; ++dp) {
          const Mesh m(tp, cp, dp, order);
          SCOPED_TRACE(order + " " + std::to_string(tp) + "x" + std::to_string(cp) + "x" + std::to_string(dp));
          std::set<int> seen;
          for (int r = 0; r < m.ranks(); ++r) {
            const int t = m.coord(r, Axis::TP), c = m.coord(r, Axis::CP), d = m.coord(r, Axis::DP);
            ASSERT_EQ(m.rank_at(t, c, d), r);
            seen.insert(r);
            for (const Axis a : kAxes) {
              const std::vector<int> g = m.group(r, a);
              ASSERT_EQ(int(g.size()), m.size(a));
              ASSERT_NE(std::find(g.begin(), g.end(), r), g.end());
              for (size_t i = 0; i < g.size(); ++i) {
                ASSERT_EQ(m.coord(g[i], a), int(i));  // by coordinate on a
                for (const Axis b : kAxes) {
                  if (b != a) {
                    ASSERT_EQ(m.coord(g[i], b), m.coord(r, b));  // the same elsewhere
                  }
                }
                ASSERT_EQ(m.color(g[i], a), m.color(r, a));
              }
              for (int o = 0; o < m.ranks(); ++o) {  // a rank outside the group has another color
                if (std::find(g.begin(), g.end(), o) == g.end()) {
                  ASSERT_NE(m.color(o, a), m.color(r, a));
                }
              }
            }
            const std::vector<int> gg = m.grad_group(r);
            ASSERT_EQ(int(gg.size()), cp * dp);
            for (int o = 0; o < m.ranks(); ++o) {
              const bool member = std::find(gg.begin(), gg.end(), o) != gg.end();
              ASSERT_EQ(member, m.coord(o, Axis::TP) == t);
              ASSERT_EQ(member, m.grad_color(o) == m.grad_color(r));
            }
          }
          ASSERT_EQ(int(seen.size()), tp * cp * dp);
          if (order == "tp-cp-dp") {  // TP innermost: rank 0's TP group is ranks 0 .. tp-1
            std::vector<int> first(size_t(tp), 0);
            for (int i = 0; i < tp; ++i) first[size_t(i)] = i;
            EXPECT_EQ(m.group(0, Axis::TP), first);
          }
          ++checked;
        }
  EXPECT_EQ(checked, 6 * 27);
}

TEST(Mesh, IdsAndRefusals) {
  EXPECT_EQ(Mesh(1, 4, 1).id(), "");
  EXPECT_EQ(Mesh(2, 4, 1).id(), "T2C4D1");
  EXPECT_EQ(Mesh(1, 2, 3).id(), "T1C2D3");
  EXPECT_EQ(Mesh::orders().size(), 6u);
  try {
    Mesh(0, 1, 1);
    FAIL() << "tp = 0 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("tp = 0"), std::string::npos) << e.what();
  }
  for (const char* bad : {"tp-tp-dp", "tp-cp", "TP-CP-DP", "tp,cp,dp", ""}) try {
      Mesh(1, 1, 1, bad);
      FAIL() << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("\"") + bad + "\""), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("tp-cp-dp"), std::string::npos) << e.what();
    }
}

}  // namespace
