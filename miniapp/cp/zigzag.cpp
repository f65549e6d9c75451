// Scheme `zigzag`: as ring, zigzag layout (2P chunks, rank r holds r and 2P-1-r): causal work balanced.
// The ring itself is ring_common.hpp; this file only names the layout.
#include "miniapp/cp/ring_common.hpp"

namespace minicp::cp {

SchemeInfo zigzag_scheme() {
  return ring_family_info("zigzag", layout::Kind::Zigzag,
                          "as ring, zigzag layout (2P chunks, rank r holds r and 2P-1-r): causal work balanced");
}

}  // namespace minicp::cp
