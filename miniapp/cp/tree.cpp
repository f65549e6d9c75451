// Scheme `tree`: placeholder until its implementation lands (refuses every case).
#include "miniapp/cp/common.hpp"

namespace minicp::cp {

SchemeInfo tree_scheme() {
  SchemeInfo s;
  s.name = "tree";
  s.summary = "not implemented yet";
  s.check = [](const Config&) -> std::string { return "tree needs an implementation"; };
  s.shard = [](const Config&, int) { return Shard{}; };
  return s;
}

}  // namespace minicp::cp
