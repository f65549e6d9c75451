// The job's ranks as a grid of tensor x context x data parallel groups (Megatron's parallel
// state): TP splits heads and FFN columns, CP the sequence, DP gives each replica its own
// sequence. A rank's coordinate on each axis comes from its world rank through the axis
// order, innermost first: with the default "tp-cp-dp" a TP group is consecutive ranks (the
// GPUs of one node when TP is the node's size), CP groups stride over them and DP over both,
// as Megatron's default order does. The weights are replicated over CP and DP, so their
// gradients are reduced over the CP x DP group: the ranks that share a TP coordinate.
// One value for the idea: the deck resolves it, a case carries it, the driver splits the
// communicator with its colors and the performance model places its groups on the links.
#pragma once
#include <array>
#include <string>
#include <vector>

namespace minicp::comm {

enum class Axis { TP = 0, CP = 1, DP = 2 };
const char* axis_name(Axis a);  // "tp", "cp", "dp"

class Mesh {
 public:
  Mesh() = default;  // 1 x 1 x 1, order tp-cp-dp
  // Throws std::invalid_argument naming the value and what is allowed: a size below 1, or an
  // order that is not the three axis names, each once, joined by '-' ("tp-cp-dp", "cp-tp-dp" ...).
  Mesh(int tp, int cp, int dp, const std::string& order = "tp-cp-dp");

  int size(Axis a) const { return n_[int(a)]; }
  int tp() const { return n_[0]; }
  int cp() const { return n_[1]; }
  int dp() const { return n_[2]; }
  int ranks() const { return n_[0] * n_[1] * n_[2]; }
  std::string order() const;  // "tp-cp-dp"
  // The orders a deck may name, in a stable order (help text and refusals).
  static std::vector<std::string> orders();

  // World rank r's coordinate on axis a, and the world rank at coordinates (tp, cp, dp).
  int coord(int r, Axis a) const;
  int rank_at(int t, int c, int d) const;
  // The world ranks of r's group along axis a, by their coordinate on a; the ranks of r's
  // CP x DP group (same TP coordinate), by world rank.
  std::vector<int> group(int r, Axis a) const;
  std::vector<int> grad_group(int r) const;
  // The same for every member of r's group along a and for no other rank: the color of a
  // communicator split that makes that group. The CP x DP group's is grad_color.
  int color(int r, Axis a) const;
  int grad_color(int r) const { return coord(r, Axis::TP); }

  // "T2C4D1" where TP or DP is above 1, "" otherwise (a case id keeps its old form on a
  // pure CP group).
  std::string id() const;

 private:
  std::array<int, 3> n_{1, 1, 1};                            // sizes by Axis
  std::array<Axis, 3> order_{Axis::TP, Axis::CP, Axis::DP};  // innermost first
  int stride(Axis a) const;                                  // world-rank step of one coordinate
};

}  // namespace minicp::comm
