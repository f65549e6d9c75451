// The output lock (see lock.hpp).
#include "harness/lock.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace minicp::harness {

namespace {

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return b;
}

std::string host_name() {
  char h[256] = {};
  if (::gethostname(h, sizeof h - 1) != 0) return "unknown";
  return h;
}

struct flock whole_file(short type) {
  struct flock l {};
  l.l_type = type;
  l.l_whence = SEEK_SET;  // l_start = l_len = 0: the whole file, however long it grows
  return l;
}

// A holder that ends removes the lock file; had we opened it just before, our lock would be on
// a removed file and protect nothing (the next run creates a new one). So the lock counts only
// while the path still names the file we locked.
bool still_there(int fd, const std::string& path) {
  struct stat a {};
  struct stat b {};
  return ::fstat(fd, &a) == 0 && ::lstat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// The lock file is truncated and written: one planted as another name of some file (a symbolic
// link, which O_NOFOLLOW refuses to open, or a hard link) would have that file overwritten.
// "" for a regular file of one name, else what it is.
std::string not_own_file(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::strerror(errno);
  if (!S_ISREG(st.st_mode)) return "is not a regular file";
  if (st.st_nlink != 1) return "has " + std::to_string(st.st_nlink) + " names (a hard link to another file)";
  return "";
}

std::string read_all(int fd) {
  std::string s;
  char b[512];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, b, sizeof b, at);
    if (n <= 0) return s;
    s.append(b, size_t(n));
    at += n;
  }
}

// The lock files this process holds, where a signal handler can read them: fixed storage,
// no allocation (a handler may only call async-signal-safe functions).
constexpr int kMaxHeld = 8;
char g_held[kMaxHeld][4096];
volatile sig_atomic_t g_held_set[kMaxHeld];
char g_stop_message[2048];  // what a stop says, "" for nothing (a rank that owns no output)

void note_held(const std::string& file, bool held) {
  for (int i = 0; i < kMaxHeld; ++i) {
    if (held && !g_held_set[i] && file.size() < sizeof g_held[i]) {
      std::memcpy(g_held[i], file.c_str(), file.size() + 1);
      g_held_set[i] = 1;
      return;
    }
    if (!held && g_held_set[i] && file == g_held[i]) g_held_set[i] = 0;
  }
}

void write_str(const char* s) {
  if (::write(STDERR_FILENO, s, std::strlen(s)) < 0) return;  // nothing to do about it here
}

extern "C" void on_stop(int sig) {
  const char* name = sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "SIGHUP";
  for (int i = 0; i < kMaxHeld; ++i)
    if (g_held_set[i]) ::unlink(g_held[i]);
  if (g_stop_message[0]) {
    write_str(g_stop_message);
    write_str(name);
    write_str(g_stop_message + std::strlen(g_stop_message) + 1);  // the part after the name
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void on_stop_signal(const std::string& before, const std::string& after) {
  const std::string both = before + '\0' + after + "\n";
  if (both.size() < sizeof g_stop_message) {
    std::memcpy(g_stop_message, both.data(), both.size());
    g_stop_message[both.size()] = '\0';
  }
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::sigaction(sig, &sa, nullptr);
}

std::string lock_file_of(const std::string& path) { return path + ".lock"; }

std::string OutputLock::take(const std::string& prog, const std::string& flag, const std::string& path) {
  release();
  const std::string file = lock_file_of(path), at = flag + " " + path + ": ";
  for (int attempt = 0; attempt < 10; ++attempt) {
    const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
    if (fd < 0 && errno == ELOOP)
      return at + "its lock file " + file + " is a symbolic link; a lock file is never followed: remove the link";
    if (fd < 0) return at + "cannot open its lock file " + file + ": " + std::strerror(errno);
    if (const std::string why = not_own_file(fd); !why.empty()) {
      ::close(fd);
      return at + "its lock file " + file + " " + why + "; it is never written through: remove it";
    }
    struct flock l = whole_file(F_WRLCK);
    if (::fcntl(fd, F_SETLK, &l) != 0) {
      const int e = errno;
      fd_ = fd;  // only to read the holder's record
      const std::string why = e == EACCES || e == EAGAIN ? busy_message(prog, flag, path)
                                                         : at + "cannot lock " + file + ": " + std::strerror(e);
      fd_ = -1;
      ::close(fd);
      return why;
    }
    if (!still_there(fd, file)) {
      ::close(fd);
      continue;
    }
    fd_ = fd;
    file_ = file;
    note_held(file_, true);
    const std::string record =
        "pid=" + std::to_string(::getpid()) + " host=" + host_name() + " since=" + utc_now() + "\n";
    // A directory that cannot take these few bytes cannot take the output either: say so now.
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, record.data(), record.size(), 0) != ssize_t(record.size())) {
      const std::string why = at + "cannot write its lock file " + file + ": " + std::strerror(errno);
      release();
      return why;
    }
    return "";
  }
  return at + "cannot lock " + file + ": it was replaced ten times in a row";
}

std::string OutputLock::busy_message(const std::string& prog, const std::string& flag, const std::string& path) const {
  long pid = 0;
  char host[256] = {}, since[64] = {};
  std::string holder;
  if (std::sscanf(read_all(fd_).c_str(), "pid=%ld host=%255s since=%63s", &pid, host, since) == 3) {
    holder = "pid " + std::to_string(pid) + " on host " + host + ", since " + since;
  } else {  // the holder has not written its record yet: the kernel still knows its pid
    struct flock l = whole_file(F_WRLCK);
    holder = ::fcntl(fd_, F_GETLK, &l) == 0 && l.l_type != F_UNLCK ? "pid " + std::to_string(l.l_pid)
                                                                   : "holder not recorded yet";
  }
  return flag + " " + path + ": in use by another " + prog + " run (" + holder + "); wait for it or choose another " +
         flag;
}

void OutputLock::release() {
  if (fd_ < 0) return;
  note_held(file_, false);
  ::unlink(file_.c_str());  // first: while we hold the lock, no one else can be using the file
  ::close(fd_);
  fd_ = -1;
  file_.clear();
}

}  // namespace minicp::harness
