// The registry table, in the order of miniapp/cp/schemes.list (minicp_schemes.inc is
// generated from it by CMake: one MINICP_SCHEME(<name>) a line).
#include "miniapp/cp/scheme.hpp"

namespace minicp::cp {

#define MINICP_SCHEME(name) SchemeInfo name##_scheme();
#include "miniapp/cp/minicp_schemes.inc"
#undef MINICP_SCHEME

const std::vector<SchemeInfo>& registry() {
#define MINICP_SCHEME(name) name##_scheme(),
  static const std::vector<SchemeInfo> table = {
#include "miniapp/cp/minicp_schemes.inc"
  };
#undef MINICP_SCHEME
  return table;
}

}  // namespace minicp::cp
