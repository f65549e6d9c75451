// minicp: full transformer layers on every CP scheme, driven by an input deck. Simply a
// driver: parse (and check everything), then run the cases (miniapp/run/driver.hpp).
#include "harness/main.hpp"
#include "miniapp/run/driver.hpp"

int main(int argc, char** argv) {
  minicp::run::Plan plan;
  return minicp::harness::main(
      argc, argv, "minicp", [&](const minicp::harness::Args& a) { plan = minicp::run::parse(a); },
      [&](const minicp::harness::Args& a) { return minicp::run::execute(a, plan); });
}
