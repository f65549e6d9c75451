// Test helpers: std::vector<double> <-> Kokkos Views of any scalar type and rank.
#pragma once
#include <string>
#include <vector>

#include "kernels/types.hpp"
#include "tests/reference.hpp"

namespace minicp::test {

template <class ViewT>
ViewT make_view(const std::string& label, const ref::Vec& data, size_t n0, size_t n1 = KOKKOS_INVALID_INDEX,
                size_t n2 = KOKKOS_INVALID_INDEX) {
  ViewT v(label, n0, n1, n2);
  auto h = Kokkos::create_mirror_view(v);
  using T = typename ViewT::non_const_value_type;
  for (size_t i = 0; i < data.size() && i < v.span(); ++i) h.data()[i] = T(data[i]);
  Kokkos::deep_copy(v, h);
  return v;
}

// Each value rounded to bf16 (to nearest even, once), as a double.
inline ref::Vec bf16_rounded(ref::Vec x) {
  for (double& e : x) e = double(float(kernels::bf16::from_double(e)));
  return x;
}

template <class ViewT>
ref::Vec to_vec(const ViewT& v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  ref::Vec out(v.span());
  for (size_t i = 0; i < v.span(); ++i) out[i] = double(h.data()[i]);
  return out;
}

template <class T>
Kokkos::View<T*, kernels::Mem> make_index_view(const std::string& label, const std::vector<T>& data) {
  Kokkos::View<T*, kernels::Mem> v(label, data.size());
  auto h = Kokkos::create_mirror_view(v);
  for (size_t i = 0; i < data.size(); ++i) h(i) = data[i];
  Kokkos::deep_copy(v, h);
  return v;
}

}  // namespace minicp::test
