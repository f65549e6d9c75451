// Output path checks and the one JSON writer (see output.hpp for the policy).
#include "harness/output.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace minicp::harness {

namespace {
std::string errno_text() { return std::strerror(errno); }

// A new, uniquely named file "<dir>/.<base>.<tag>.XXXXXX" (mkstemp); fd < 0 on failure.
int make_temp(const std::string& path, const char* tag, std::string& name) {
  name = parent_dir(path) + "/." + base_name(path) + "." + tag + ".XXXXXX";
  return ::mkstemp(name.data());
}
}  // namespace

std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string write_all(int fd, const char* data, size_t n) {
  for (size_t done = 0; done < n;) {
    const ssize_t w = ::write(fd, data + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno_text();
    if (w == 0) return std::strerror(ENOSPC);  // a write that takes nothing: the device is full
    done += size_t(w);
  }
  return "";
}

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

namespace {
std::string file_identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return "inode " + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  const std::string dir = parent_dir(path);
  char* real = ::realpath(dir.c_str(), nullptr);
  const std::string id = "path " + (real ? std::string(real) : dir) + "/" + base_name(path);
  std::free(real);
  return id;
}
}  // namespace

bool same_file(const std::string& a, const std::string& b) {
  return !a.empty() && !b.empty() && file_identity(a) == file_identity(b);
}

std::string output_path_problem(const std::string& flag, const std::string& path) {
  if (path.empty()) return flag + " '': needs a file name";
  const std::string at = flag + " " + path + ": ";
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return at + "is a directory; give the name of a file to write";
    if (!S_ISREG(st.st_mode)) return at + "exists and is not a regular file";
    if (st.st_nlink > 1)
      return at + "the file has " + std::to_string(st.st_nlink) + " names (hard links); a run writing it by another " +
             "name would go unseen: give " + flag + " a file of one name, or remove the other names";
  } else if (errno != ENOENT && errno != ENOTDIR) {
    return at + errno_text();
  }
  const std::string dir = parent_dir(path);
  if (::stat(dir.c_str(), &st) != 0)
    return at + (errno == ENOENT ? "directory " + dir + " does not exist" : dir + ": " + errno_text());
  if (!S_ISDIR(st.st_mode)) return at + dir + " is not a directory";
  std::string probe;
  const int fd = make_temp(path, "write-test", probe);
  if (fd < 0) return at + "directory " + dir + " is not writable (creating a file there failed: " + errno_text() + ")";
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

std::function<bool(const Json&)> json_file_kind(const std::string& kind) {
  return [kind](const Json& j) { return j.is_object() && j.contains("file_kind") && j["file_kind"] == kind; };
}

namespace {
// "" when the existing file at o.path (or none, or an empty one) is the output's own kind.
std::string kind_problem(const OutputFile& o) {
  struct stat st {};
  if (!o.own || ::stat(o.path.c_str(), &st) != 0 || st.st_size == 0) return "";
  bool own = false;
  try {
    std::FILE* f = std::fopen(o.path.c_str(), "rb");
    if (f) {
      std::string text(size_t(st.st_size), '\0');
      const size_t n = std::fread(text.data(), 1, text.size(), f);
      std::fclose(f);
      text.resize(n);
      own = o.own(Json::parse(text));
    }
  } catch (const std::exception&) {
    own = false;  // not JSON: another kind
  }
  return own ? ""
             : o.flag + " " + o.path + ": exists and is not " + o.what + "; give " + o.flag +
                   " another name, or --overwrite to replace it";
}
}  // namespace

void check_outputs(const Args& a, const std::vector<OutputFile>& outs, bool overwrite) {
  check_on_root(a, [&] {
    for (const OutputFile& o : outs) {
      if (o.path.empty()) continue;
      std::string why = output_path_problem(o.flag, o.path);
      if (why.empty() && !overwrite) why = kind_problem(o);
      if (!why.empty()) return why;
    }
    return std::string();
  });
}

void remove_old_outputs(const Args& a, const std::vector<OutputFile>& outs) {
  if (a.rank() != 0) return;
  for (const OutputFile& o : outs)
    if (!o.path.empty() && ::unlink(o.path.c_str()) != 0 && errno != ENOENT)
      throw std::runtime_error(o.flag + " " + o.path + ": cannot remove the old file: " + errno_text());
}

std::string output_target(const std::string& path) {
  std::string at = path;
  for (int hop = 0; hop < 40; ++hop) {  // as the kernel's limit: a loop is left to stat to report
    struct stat st {};
    if (::lstat(at.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return at;
    std::string to(size_t(st.st_size > 0 ? st.st_size : 4096), '\0');
    const ssize_t n = ::readlink(at.c_str(), to.data(), to.size());
    if (n <= 0) return at;
    to.resize(size_t(n));
    const std::string dir = parent_dir(at);
    at = to.front() == '/' || at.find('/') == std::string::npos ? to : (dir == "/" ? "" : dir) + "/" + to;
  }
  return at;
}

void write_json(const std::string& flag, const std::string& path, const Json& doc, int indent) {
  write_text(flag, path, doc.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

void write_text(const std::string& flag, const std::string& path, const std::string& text) {
  const std::string at = flag + " " + path + ": ";
  std::string tmp;
  const int fd = make_temp(path, "tmp", tmp);
  if (fd < 0)
    throw std::runtime_error(at + "cannot create a temporary file in " + parent_dir(path) + ": " + errno_text());
  // mkstemp creates mode 0600; give the file the mode a plain create would (0666 & ~umask).
  const mode_t mask = ::umask(0);
  ::umask(mask);
  std::string why;
  if (::fchmod(fd, 0666 & ~mask) != 0) why = "chmod: " + errno_text();
  if (why.empty()) {
    const std::string w = write_all(fd, text.data(), text.size());
    if (!w.empty()) why = "write: " + w;
  }
  if (::close(fd) != 0 && why.empty()) why = "close: " + errno_text();
  if (why.empty() && std::rename(tmp.c_str(), path.c_str()) != 0) why = "rename: " + errno_text();
  if (!why.empty()) {
    ::unlink(tmp.c_str());
    throw std::runtime_error(at + "cannot write: " + why);
  }
}

}  // namespace minicp::harness
