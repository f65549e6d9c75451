// Test helpers: this process's rank and the number of ranks in MPI_COMM_WORLD.
#pragma once
#include <mpi.h>

namespace minicp::test {

inline int world_size() {
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}
inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

}  // namespace minicp::test
