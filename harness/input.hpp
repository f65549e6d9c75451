// Files a program reads from its user (a deck, a calibration table, a fabric profile, a results
// file to resume or compare with): looked at before they are read, so that what is no file at
// all is refused at once, not read. A FIFO would block the open for ever, a device such as
// /dev/zero would be read until memory runs out; a regular file larger than any real one of
// its kind is a mistake (a wrong path), not an input.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace minicp::harness {

// What a file is (for messages) and the most bytes one may have (0: any size, for files that
// are read in place rather than whole, such as HDF5 files).
struct InputKind {
  const char* what;
  uint64_t max_bytes;
};
inline constexpr InputKind kDeckFile{"a deck", uint64_t(16) << 20};
inline constexpr InputKind kFabricFile{"a fabric profile", uint64_t(16) << 20};
inline constexpr InputKind kCalibrationFile{"a calibration table", uint64_t(256) << 20};
inline constexpr InputKind kResultsFile{"a results file", 0};
inline constexpr InputKind kLengthsFile{"a lengths file", uint64_t(64) << 20};
inline constexpr InputKind kMixFile{"a document mix", uint64_t(1) << 20};

// A folder of named TOML inputs (fabric profiles, document mixes): the environment variable
// env when set, else the source tree's inputs/<sub>.
std::string inputs_dir(const char* env, const std::string& sub);
// The names of the .toml files in dir (without .toml), sorted; none when dir cannot be read.
std::vector<std::string> toml_names(const std::string& dir);

// "" when path names a regular file this process can read, of at most kind.max_bytes; else
// why not ("no such file", "is a directory", "is not a regular file (a FIFO)", "is 300.0 MiB;
// a calibration table has at most 256.0 MiB", "cannot be read: Permission denied"). A file
// that is not regular is never opened.
std::string input_file_problem(const std::string& path, const InputKind& kind);

// The bytes of path, checked as above (on the open file too, so that a file swapped for a FIFO
// in between is refused as well); throws std::runtime_error "<path>: <why>".
std::string read_input_file(const std::string& path, const InputKind& kind);

}  // namespace minicp::harness
