// Shared main of every test binary: the BLAS core -> MPI_Init_thread -> Kokkos::initialize -> GoogleTest.
// Only rank 0 prints; the exit code is non-zero on every rank if any rank failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstring>
#include <string>

#include "harness/blas.hpp"

// Set by --scheme=NAME (used by the CP tests; other binaries ignore it).
std::string g_scheme = "none";

int main(int argc, char** argv) {
  minicp::harness::select_blas_core(argv);  // the BLAS core this CPU offers (harness/blas.hpp)
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--scheme=", 9) == 0)
      g_scheme = argv[i] + 9;
    else
      argv[kept++] = argv[i];
  }
  argc = kept;
  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    failed = RUN_ALL_TESTS();
  }
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed ? 1 : 0;
}
