// Scheme `ring`: K,V blocks around a ring (pass-KV), contiguous layout; causal work is imbalanced, fully masked steps
// are skipped. The ring itself is ring_common.hpp; this file only names the layout.
#include "miniapp/cp/ring_common.hpp"

namespace minicp::cp {

SchemeInfo ring_scheme() {
  return ring_family_info("ring", layout::Kind::Contiguous,
                          "K,V blocks around a ring (pass-KV), contiguous layout; causal work is imbalanced, fully "
                          "masked steps are skipped");
}

}  // namespace minicp::cp
