// Backend-neutral parts of the communicator: group splits along the rank grid, sizes of
// the data types, parsing of the progress strategy.
#include "comm/comm.hpp"

#include <stdexcept>

namespace minicp::comm {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::I64: return 8;
  }
  return 0;
}

Progress parse_progress(const std::string& s) {
  if (s == "none") return Progress::None;
  if (s == "thread") return Progress::Thread;
  throw std::invalid_argument("progress '" + s + "' is not one of: none, thread");
}

namespace {
void check_divides(int size, int ranks, const std::string& name) {
  if (size < 1 || ranks % size != 0)
    throw std::invalid_argument("group '" + name + "' size " + std::to_string(size) + " must divide the " +
                                std::to_string(ranks) + " ranks");
}
}  // namespace

Group Communicator::split_contiguous(int size, const std::string& name) {
  check_divides(size, world_.size, name);
  return split_color(world_.rank / size, name);
}

Group Communicator::split_strided(int size, const std::string& name) {
  check_divides(size, world_.size, name);
  return split_color(world_.rank % (world_.size / size), name);
}

}  // namespace minicp::comm
