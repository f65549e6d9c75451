// The MPI communicator of a group's ranks (Group::mpi), which every backend keeps beside its
// own: what a driver's control messages go over. The one place the handle is cast.
#pragma once
#include <mpi.h>

#include "comm/comm.hpp"

namespace minicp::comm {

inline MPI_Comm mpi_of(const Group& g) { return *static_cast<const MPI_Comm*>(g.mpi); }

}  // namespace minicp::comm
