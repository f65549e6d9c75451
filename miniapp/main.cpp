// minicp: full transformer layers on every CP scheme, driven by an input deck. Simply a
// driver: parse (and check everything), then run the cases (miniapp/run/driver.hpp).
#include "harness/main.hpp"
#include "miniapp/run/driver.hpp"

int main(int argc, char** argv) {
  // The fabric profile's settings go into the environment before MPI starts (a prediction
  // runs nothing on it: a cluster profile is read on a laptop).
  if (!minicp::run::predict_only(argc, argv))
    if (const int rc = minicp::harness::apply_fabric("minicp", minicp::run::requested_fabric(argc, argv)); rc >= 0)
      return rc;
  minicp::run::Plan plan;
  return minicp::harness::main(
      argc, argv, "minicp", [&](const minicp::harness::Args& a) { plan = minicp::run::parse(a); },
      [&](const minicp::harness::Args& a) {
        // The output locks go before MPI_Finalize however the run ends: once one rank exits with
        // an error code, mpirun ends the others, rank 0 with its lock files among them.
        struct Release {
          minicp::run::Plan& plan;
          ~Release() { plan.locks.clear(); }
        } release{plan};
        return minicp::run::execute(a, plan);
      });
}
