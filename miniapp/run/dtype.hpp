// The stored value type a deck's run.dtype names, as a C++ type: the one place the name
// becomes a type, so every binary dispatches the same way.
#pragma once
#include <cstddef>
#include <string>

#include "kernels/bf16.hpp"

namespace minicp::run {

// Calls f(T{}) with T the type run.dtype names ("f64", "bf16", else fp32), returning its result.
template <class F>
decltype(auto) with_dtype(const std::string& dtype, F&& f) {
  if (dtype == "f64") return f(double{});
  if (dtype == "bf16") return f(kernels::bf16{});
  return f(float{});
}

// Bytes per stored value of run.dtype (bf16: 2; its accumulators are fp32).
inline size_t elem_size(const std::string& dtype) {
  return with_dtype(dtype, [](auto t) { return sizeof(t); });
}

}  // namespace minicp::run
