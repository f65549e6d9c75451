// Scheme `doublering`: placeholder until its implementation lands (refuses every case).
#include "miniapp/cp/common.hpp"

namespace minicp::cp {

SchemeInfo doublering_scheme() {
  SchemeInfo s;
  s.name = "doublering";
  s.summary = "not implemented yet";
  s.check = [](const Config&) -> std::string { return "doublering needs an implementation"; };
  s.shard = [](const Config&, int) { return Shard{}; };
  return s;
}

}  // namespace minicp::cp
