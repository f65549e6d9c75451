// Scheme `allgather`: placeholder until its implementation lands (refuses every case).
#include "miniapp/cp/common.hpp"

namespace minicp::cp {

SchemeInfo allgather_scheme() {
  SchemeInfo s;
  s.name = "allgather";
  s.summary = "not implemented yet";
  s.check = [](const Config&) -> std::string { return "allgather needs an implementation"; };
  s.shard = [](const Config&, int) { return Shard{}; };
  return s;
}

}  // namespace minicp::cp
