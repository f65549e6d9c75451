// Scheme `passq`: placeholder until its implementation lands (refuses every case).
#include "miniapp/cp/common.hpp"

namespace minicp::cp {

SchemeInfo passq_scheme() {
  SchemeInfo s;
  s.name = "passq";
  s.summary = "not implemented yet";
  s.check = [](const Config&) -> std::string { return "passq needs an implementation"; };
  s.shard = [](const Config&, int) { return Shard{}; };
  return s;
}

}  // namespace minicp::cp
