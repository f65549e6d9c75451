// Scheme `stripe`: as ring, striped layout (token t on rank t mod P): causal work balanced.
// The ring itself is ring_common.hpp; this file only names the layout.
#include "miniapp/cp/ring_common.hpp"

namespace minicp::cp {

SchemeInfo stripe_scheme() {
  return ring_family_info("stripe", layout::Kind::Striped,
                          "as ring, striped layout (token t on rank t mod P): causal work balanced");
}

}  // namespace minicp::cp
