// Output files: checked before any work, written whole or not at all. An output flag's path
// must name a regular file of one name (or nothing yet) in an existing directory this process
// can create files in; a directory, a missing directory, an unwritable one or a file with
// other names (hard links) is refused at start, not after the run. A file is replaced by a
// rename, which gives its name a new file: another name of the old one would keep the old
// contents, and another program could write them meanwhile by that name.
//
// Policy for an old file at the path: check_outputs() leaves it alone (a refused run changes
// nothing); remove_old_outputs(), the first step of the run, deletes it, so a run that fails
// later leaves no file rather than an old one that looks new. write_json() writes to a
// temporary file in the same directory and renames it into place, removing the temporary
// on any failure.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "harness/main.hpp"

namespace minicp::harness {

// Keys keep the order they are set in.
using Json = nlohmann::ordered_json;

struct OutputFile {
  OutputFile(std::string flag, std::string path, std::string what = "", std::function<bool(const Json&)> own = {})
      : flag(std::move(flag)), path(std::move(path)), what(std::move(what)), own(std::move(own)) {}
  std::string flag;  // as the user typed it: "--json"
  std::string path;  // empty: the flag was not given (skipped)
  // The JSON this program writes there: an existing file that is not such a JSON object is
  // replaced only with --overwrite. `what` names it in the refusal ("a minicp-cp-bench
  // result"); an empty `own` takes any regular file.
  std::string what;
  std::function<bool(const Json&)> own;
};

// The `own` of a JSON output that records "file_kind": kind.
std::function<bool(const Json&)> json_file_kind(const std::string& kind);

// "" when path can be written as an output file, else "<flag> <path>: <why>". Writability is
// tested by creating and removing a uniquely named file in the target directory.
std::string output_path_problem(const std::string& flag, const std::string& path);

// The file an output path writes: path, or where the symbolic link at its last component leads
// (links to links followed; a relative link read from the link's directory). An output is
// locked and written there, so the link stays a link to the new file, and two names of one
// file have one lock. A directory part is the kernel's to follow: its links lead to one file.
std::string output_target(const std::string& path);

// Rank 0 checks every given output (output_path_problem, and without overwrite an existing
// file that is not the output's own kind); a problem throws UsageError on every rank. Call
// from the parse step.
void check_outputs(const Args& a, const std::vector<OutputFile>& outs, bool overwrite = false);

// Rank 0 deletes the files at the given outputs' paths (see the policy above).
void remove_old_outputs(const Args& a, const std::vector<OutputFile>& outs);

// Writes text to path through a temporary file in its directory, renamed into place; throws
// std::runtime_error "<flag> <path>: ..." when that fails, leaving no temporary behind.
void write_text(const std::string& flag, const std::string& path, const std::string& text);

// Writes doc (pretty-printed with indent spaces; NaN and infinities as null) to path through
// a temporary file in its directory; throws std::runtime_error "<flag> <path>: ..." when
// that fails, leaving no temporary behind.
void write_json(const std::string& flag, const std::string& path, const Json& doc, int indent = 1);

// The directory part of path ("." when there is none), and the part after it.
std::string parent_dir(const std::string& path);
std::string base_name(const std::string& path);

// Writes all n bytes of data to the file descriptor fd (short writes continued, EINTR
// retried); "" or the system's reason ("No space left on device").
std::string write_all(int fd, const char* data, size_t n);

// Whether two paths name one file, however spelt ("r.h5", "./r.h5", a link to it): the same
// device and inode when both exist, else the same real directory and name (a file not made
// yet). An empty path names no file.
bool same_file(const std::string& a, const std::string& b);

}  // namespace minicp::harness
