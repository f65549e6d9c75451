// The checks of input files (see input.hpp).
#include "harness/input.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "harness/memory.hpp"

namespace minicp::harness {

namespace {

std::string kind_of(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a file";
}

std::string stat_problem(const struct stat& st, const InputKind& kind) {
  if (S_ISDIR(st.st_mode)) return "is a directory; give a file";
  if (!S_ISREG(st.st_mode)) return "is not a regular file (" + kind_of(st.st_mode) + "); give a regular file";
  if (kind.max_bytes > 0 && uint64_t(st.st_size) > kind.max_bytes)
    return "is " + human_bytes(double(st.st_size)) + ", more than " + kind.what + " ever has (at most " +
           human_bytes(double(kind.max_bytes)) + "); is it the right file?";
  return "";
}

std::string open_problem(int e) {
  return e == ENOENT ? "no such file" : std::string("cannot be read: ") + std::strerror(e);
}

}  // namespace

std::string input_file_problem(const std::string& path, const InputKind& kind) {
  if (path.empty()) return "needs a file name";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return open_problem(errno);
  const std::string why = stat_problem(st, kind);
  if (!why.empty()) return why;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return open_problem(errno);
  ::close(fd);
  return "";
}

std::string read_input_file(const std::string& path, const InputKind& kind) {
  // Non-blocking: the open of a FIFO must not hang; fstat of the open file then refuses it (and
  // a file swapped for one after a check by name).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  std::string why = fd < 0 ? open_problem(errno) : "";
  struct stat st {};
  if (why.empty() && ::fstat(fd, &st) != 0) why = open_problem(errno);
  if (why.empty()) why = stat_problem(st, kind);
  std::string text;
  char b[1 << 16];
  while (why.empty()) {
    const ssize_t n = ::read(fd, b, sizeof b);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) why = open_problem(errno);
    if (n <= 0) break;
    text.append(b, size_t(n));
    if (kind.max_bytes > 0 && text.size() > kind.max_bytes)
      why = "grew past " + human_bytes(double(kind.max_bytes)) + " while being read";
  }
  if (fd >= 0) ::close(fd);
  if (!why.empty()) throw std::runtime_error(path + ": " + why);
  return text;
}

std::string inputs_dir(const char* env, const std::string& sub) {
  if (const char* e = std::getenv(env); e && *e) return e;
  return std::string(MINICP_SOURCE_DIR) + "/inputs/" + sub;
}

std::vector<std::string> toml_names(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    for (dirent* e; (e = readdir(d));) {
      const std::string n = e->d_name;
      if (n.size() > 5 && n.compare(n.size() - 5, 5, ".toml") == 0) out.push_back(n.substr(0, n.size() - 5));
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace minicp::harness
