// Scheme `usp`: placeholder until its implementation lands (refuses every case).
#include "miniapp/cp/common.hpp"

namespace minicp::cp {

SchemeInfo usp_scheme() {
  SchemeInfo s;
  s.name = "usp";
  s.summary = "not implemented yet";
  s.check = [](const Config&) -> std::string { return "usp needs an implementation"; };
  s.shard = [](const Config&, int) { return Shard{}; };
  return s;
}

}  // namespace minicp::cp
