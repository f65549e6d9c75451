// The tp x cp x dp grid of a job (see mesh.hpp).
#include "comm/mesh.hpp"

#include <algorithm>
#include <stdexcept>

namespace minicp::comm {

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::TP: return "tp";
    case Axis::CP: return "cp";
    default: return "dp";
  }
}

std::vector<std::string> Mesh::orders() {
  std::array<Axis, 3> p{Axis::TP, Axis::CP, Axis::DP};
  std::vector<std::string> out;
  do {
    out.push_back(std::string(axis_name(p[0])) + "-" + axis_name(p[1]) + "-" + axis_name(p[2]));
  } while (std::next_permutation(p.begin(), p.end()));
  return out;
}

Mesh::Mesh(int tp, int cp, int dp, const std::string& order) : n_{tp, cp, dp} {
  for (const Axis a : {Axis::TP, Axis::CP, Axis::DP})
    if (n_[int(a)] < 1)
      throw std::invalid_argument(std::string(axis_name(a)) + " = " + std::to_string(n_[int(a)]) +
                                  ": a mesh axis holds at least 1 rank");
  const std::vector<std::string> all = orders();
  const auto it = std::find(all.begin(), all.end(), order);
  if (it == all.end()) {
    std::string allowed;
    for (const std::string& o : all) allowed += (allowed.empty() ? "" : ", ") + o;
    throw std::invalid_argument("rank order \"" + order + "\": allowed are " + allowed + " (innermost axis first)");
  }
  for (size_t i = 0; i < 3; ++i) {
    const std::string name = order.substr(3 * i, 2);
    order_[i] = name == "tp" ? Axis::TP : name == "cp" ? Axis::CP : Axis::DP;
  }
}

std::string Mesh::order() const {
  return std::string(axis_name(order_[0])) + "-" + axis_name(order_[1]) + "-" + axis_name(order_[2]);
}

int Mesh::stride(Axis a) const {
  int s = 1;
  for (const Axis b : order_) {
    if (b == a) return s;
    s *= n_[int(b)];
  }
  return s;
}

int Mesh::coord(int r, Axis a) const { return r / stride(a) % n_[int(a)]; }

int Mesh::rank_at(int t, int c, int d) const {
  return t * stride(Axis::TP) + c * stride(Axis::CP) + d * stride(Axis::DP);
}

std::vector<int> Mesh::group(int r, Axis a) const {
  const int base = r - coord(r, a) * stride(a);
  std::vector<int> out;
  for (int i = 0; i < n_[int(a)]; ++i) out.push_back(base + i * stride(a));
  return out;
}

std::vector<int> Mesh::grad_group(int r) const {
  std::vector<int> out;
  for (int d = 0; d < dp(); ++d)
    for (int c = 0; c < cp(); ++c) out.push_back(rank_at(coord(r, Axis::TP), c, d));
  std::sort(out.begin(), out.end());
  return out;
}

int Mesh::color(int r, Axis a) const { return r - coord(r, a) * stride(a); }

std::string Mesh::id() const {
  if (tp() == 1 && dp() == 1) return "";
  return "T" + std::to_string(tp()) + "C" + std::to_string(cp()) + "D" + std::to_string(dp());
}

}  // namespace minicp::comm
