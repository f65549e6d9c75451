// The registry table: one line per scheme. tests/CMakeLists.txt reads the names from the
// lines below to generate cp.<scheme>.np<P> tests, so keep the "  <name>_scheme()," form.
#include "miniapp/cp/scheme.hpp"

namespace minicp::cp {

SchemeInfo none_scheme();
SchemeInfo ring_scheme();
SchemeInfo zigzag_scheme();
SchemeInfo stripe_scheme();
SchemeInfo ulysses_scheme();
SchemeInfo usp_scheme();
SchemeInfo allgather_scheme();
SchemeInfo passq_scheme();
SchemeInfo tree_scheme();
SchemeInfo doublering_scheme();

const std::vector<SchemeInfo>& registry() {
  // clang-format off
  static const std::vector<SchemeInfo> table = {
  none_scheme(),
  ring_scheme(),
  zigzag_scheme(),
  stripe_scheme(),
  ulysses_scheme(),
  usp_scheme(),
  allgather_scheme(),
  passq_scheme(),
  tree_scheme(),
  doublering_scheme(),
  };
  // clang-format on
  return table;
}

}  // namespace minicp::cp
