// Ownership of an output file for the whole run: two jobs given the same output must not
// both write it (each would remove, recreate and rename over the other's file, and both
// would end with a file that mixes their cases). The owner holds a POSIX record lock
// (fcntl F_SETLK, write lock) on "<path>.lock" beside the output: the kernel drops it when
// the process ends in any way (a killed run leaves no lock behind, only the lock file, which
// the next run simply takes), and it works on NFS. The lock file holds the owner's pid, host
// and UTC start, so a refused run can say who holds it. A lock file that is a symbolic link,
// a hard link or no regular file is refused, never followed or written through (a link
// planted there would have its target overwritten with the record).
//
// POSIX record locks belong to the process and go with ANY descriptor of the file that the
// process closes: nothing else in the process may open the lock file while it is held.
#pragma once
#include <string>

namespace minicp::harness {

class OutputLock {
 public:
  OutputLock() = default;
  ~OutputLock() { release(); }
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

  // Takes the lock of `path` (the file "<path>.lock", created when missing). Returns "" when
  // this process now holds it, else "<flag> <path>: in use by another <prog> run (pid P on
  // host H, since T); wait for it or choose another <flag>", or why the lock file cannot be
  // used. Serial: call on the one rank that owns the outputs.
  std::string take(const std::string& prog, const std::string& flag, const std::string& path);
  // Removes the lock file, then lets the lock go (nothing when not held).
  void release();
  bool held() const { return fd_ >= 0; }
  const std::string& file() const { return file_; }

 private:
  std::string busy_message(const std::string& prog, const std::string& flag, const std::string& path) const;
  int fd_ = -1;
  std::string file_;
};

// From now on SIGTERM, SIGINT and SIGHUP remove the lock files this process holds, print
// "<before><signal name><after>" (when before is not empty) and end the process as the
// signal would. For a run stopped by its batch system or a ^C: no lock is left behind, and
// the message says what the user can do (resume).
void on_stop_signal(const std::string& before, const std::string& after);

// The lock file of an output path.
std::string lock_file_of(const std::string& path);

}  // namespace minicp::harness
