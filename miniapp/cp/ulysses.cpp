// Scheme `ulysses`: placeholder until its implementation lands (refuses every case).
#include "miniapp/cp/common.hpp"

namespace minicp::cp {

SchemeInfo ulysses_scheme() {
  SchemeInfo s;
  s.name = "ulysses";
  s.summary = "not implemented yet";
  s.check = [](const Config&) -> std::string { return "ulysses needs an implementation"; };
  s.shard = [](const Config&, int) { return Shard{}; };
  return s;
}

}  // namespace minicp::cp
