// The HDF5 writer (see h5.hpp): parallel HDF5 C API through MPI-IO, collective data writes.
#include "miniapp/record/h5.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "harness/main.hpp"
#include "harness/output.hpp"

namespace minicp::record {

static_assert(std::is_same<hid_t, int64_t>::value, "h5.hpp stores hid_t as int64_t (HDF5 >= 1.10)");

namespace {

// Silences HDF5's own printing of its error stack while in scope: a failure is reported
// once, by the exception, with the stack's innermost messages (hdf5_message).
class Quiet {
 public:
  Quiet() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~Quiet() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  Quiet(const Quiet&) = delete;
  Quiet& operator=(const Quiet&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

herr_t collect(unsigned n, const H5E_error2_t* e, void* out) {
  auto& s = *static_cast<std::string*>(out);
  if (n < 2 && e->desc && *e->desc) s += (s.empty() ? "" : "; ") + std::string(e->desc);
  return 0;
}
// The two innermost messages of HDF5's error stack (then cleared), or "" when empty.
std::string hdf5_message() {
  std::string s;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect, &s);
  H5Eclear2(H5E_DEFAULT);
  return s;
}

// An HDF5 identifier closed at scope exit by its close function.
class Id {
 public:
  Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Id() {
    if (id_ >= 0) close_(id_);
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  operator hid_t() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// The memory and file (little-endian) types of a value type.
template <class T>
hid_t mem_type() {
  if constexpr (std::is_same<T, float>::value) return H5T_NATIVE_FLOAT;
  if constexpr (std::is_same<T, double>::value) return H5T_NATIVE_DOUBLE;
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value || std::is_same<T, int64_t>::value,
                "HDF5 datasets of float, double or int64_t");
  return H5T_NATIVE_INT64;
}
template <class T>
hid_t file_type() {
  if constexpr (std::is_same<T, float>::value) return H5T_IEEE_F32LE;
  if constexpr (std::is_same<T, double>::value) return H5T_IEEE_F64LE;
  return H5T_STD_I64LE;
}

// Maximal runs of consecutive rows (start, length) of a sorted, duplicate-free row list.
using Runs = std::vector<std::pair<int64_t, int64_t>>;
Runs runs_of(const std::vector<int64_t>& sorted) {
  Runs r;
  for (int64_t row : sorted) {
    if (!r.empty() && r.back().first + r.back().second == row)
      ++r.back().second;
    else
      r.emplace_back(row, 1);
  }
  return r;
}

constexpr const char* kTempInfix = ".tmp.";  // <path>.tmp.<pid of rank 0>: a transaction's temporary

// What HDF5 (1.10, its default file format, written as here) adds to a file, in bytes: about
// twice what it was measured to add (docs/results-file.md), so that a transaction's sum of
// them stays above what it writes. kMargin covers what comes in lumps: a fresh block of the
// metadata and of the small-data aggregator (2048 each), a fresh global heap collection for
// variable-length strings (4096), and as much again.
constexpr int64_t kNewFileBytes = 2048;  // superblock and root group (800)
constexpr int64_t kGroupBytes = 1536;    // object header, local heap, B-tree node (800 with its link)
constexpr int64_t kLinkBytes = 256;      // a symbol table entry, its share of symbol and B-tree nodes
constexpr int64_t kHeaderBytes = 1024;   // a dataset's object header besides its datatype (500)
constexpr int64_t kAttrBytes = 128;      // an attribute message, its share of header chunks (64 with its name)
constexpr int64_t kMargin = 3 * 4096;
constexpr int64_t kAhead = 64 * 1024;  // reserved beyond the need, so that most members need no call

int64_t align8(int64_t n) { return (n + 7) / 8 * 8; }

// Makes the first `bytes` of the open file fd allocated on disk without changing its size,
// so that writes below them cannot fail for want of space: "" or the system's reason. Where
// the file system cannot allocate ahead, its free space is checked instead (no guarantee:
// another process may take it meanwhile).
std::string allocate(int fd, int64_t bytes) {
  int rc = 0;
  do rc = ::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, off_t(bytes));
  while (rc != 0 && errno == EINTR);
  if (rc == 0) return "";
  if (errno != EOPNOTSUPP && errno != ENOSYS) return std::strerror(errno);
  struct stat st {};
  struct statvfs fs {};
  if (::fstat(fd, &st) != 0 || ::fstatvfs(fd, &fs) != 0) return "";  // nothing known: let HDF5 try
  const int64_t more = bytes - int64_t(st.st_blocks) * 512, free = int64_t(fs.f_bavail) * int64_t(fs.f_frsize);
  if (more <= free) return "";
  return std::string(std::strerror(ENOSPC)) + " (" + std::to_string(free) + " bytes free)";
}

// The message of a reservation that failed: the file, what it was for and the reason.
std::string no_room(const std::string& path, const std::string& what, const std::string& temp, int64_t bytes,
                    const std::string& why) {
  return "HDF5 file '" + path + "': no room for " + what + ": its temporary '" + temp + "' needs " +
         std::to_string(bytes) + " bytes: " + why;
}

// Reserves the first `want` bytes of the file, or at least `need`: "" (*got the bytes now
// reserved) or why not.
std::string reserve_on_disk(const std::string& file, int64_t need, int64_t want, int64_t* got) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return "open: " + std::string(std::strerror(errno));
  std::string why = allocate(fd, want);
  *got = want;
  if (!why.empty() && want > need) why = allocate(fd, need), *got = need;
  ::close(fd);
  return why;
}

// Gives back what is reserved beyond the end of the file (a hole punched there, or a
// truncation to its size), so that a committed file takes no more disk than its size.
void release_beyond_end(const std::string& file, int64_t reserved) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_CLOEXEC);
  struct stat st {};
  if (fd < 0) return;
  if (::fstat(fd, &st) == 0 && reserved > st.st_size &&
      ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, st.st_size, reserved - st.st_size) != 0 &&
      ::ftruncate(fd, st.st_size) != 0) {
    // the space stays taken until the file goes; nothing else is wrong
  }
  ::close(fd);
}

// Copies the file `from` into the open, empty file `out` (named `to`): "" or what failed and
// the system's reason ("read 'r.h5': Input/output error").
std::string copy_into(const std::string& from, int out, const std::string& to) {
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return "open '" + from + "': " + std::strerror(errno);
  std::string why;
  std::vector<char> buf(size_t(1) << 20);
  for (;;) {
    const ssize_t n = ::read(in, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) why = "read '" + from + "': " + std::strerror(errno);
    if (n <= 0) break;
    const std::string w = harness::write_all(out, buf.data(), size_t(n));
    if (!w.empty()) {
      why = "write '" + to + "': " + w;
      break;
    }
  }
  ::close(in);
  return why;
}

// Rank 0 makes the temporary `temp` (a stale one is replaced), empty or a copy of `from`,
// with the disk space it is to hold reserved first: *planned (the copy or, for a new file,
// what H5Fcreate writes) and kMargin. HDF5 truncates an existing file only when it is not
// empty, so the reservation of an empty one survives H5Fcreate. "" (*planned and *reserved
// set) or the message; a failure removes the temporary.
std::string make_temporary(const std::string& path, const std::string& temp, const std::string& from, int64_t* planned,
                           int64_t* reserved) {
  const std::string head = "HDF5 file '" + path + "': ";
  struct stat st {};
  if (!from.empty() && ::stat(from.c_str(), &st) != 0)
    return head + "cannot copy '" + from + "' to its temporary: " + std::strerror(errno);
  // A new file, never one a link planted at the name points to (a stale temporary of the same
  // name is removed first).
  if (::unlink(temp.c_str()) != 0 && errno != ENOENT)
    return head + "cannot remove a stale temporary '" + temp + "': " + std::strerror(errno);
  const int out = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (out < 0)
    return head + "cannot create its temporary '" + temp +
           "' (the directory must exist and be writable): " + std::strerror(errno);
  *planned = from.empty() ? kNewFileBytes : int64_t(st.st_size);
  *reserved = *planned + kMargin;
  std::string why = allocate(out, *reserved);
  if (!why.empty())
    why = no_room(path, from.empty() ? "a new file" : "a copy of '" + from + "'", temp, *reserved, why);
  else if (!from.empty() && !(why = copy_into(from, out, temp)).empty())
    why = head + "cannot copy '" + from + "' to its temporary: " + why;
  if (::close(out) != 0 && why.empty())
    why = head + "cannot close its temporary '" + temp + "': " + std::strerror(errno);
  if (!why.empty()) ::unlink(temp.c_str());
  return why;
}

// The heap bytes of the names of an existing group's links.
int64_t names_bytes(hid_t file, const std::string& group) {
  int64_t sum = 0;
  if (H5Literate_by_name(
          file, group.c_str(), H5_INDEX_NAME, H5_ITER_NATIVE, nullptr,
          [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
            *static_cast<int64_t*>(out) += align8(int64_t(std::strlen(name)) + 1);
            return 0;
          },
          &sum, H5P_DEFAULT) < 0)
    H5Eclear2(H5E_DEFAULT);
  return sum;
}

// Calls fn(parent, name, path) for each component `name` of the HDF5 path "/a/b/c" in turn,
// with its parent's path ("" for the root) and its own.
template <class Fn>
void each_component(const std::string& path, Fn&& fn) {
  std::string prefix;
  size_t i = 0;
  while (i < path.size()) {
    const size_t j = std::min(path.find('/', i), path.size());
    if (j > i) {
      const std::string parent = prefix;
      prefix += "/" + path.substr(i, j - i);
      fn(parent, path.substr(i, j - i), prefix);
    }
    i = j + 1;
  }
}

bool mpi_finalized() {
  int f = 0;
  MPI_Finalized(&f);
  return f != 0;
}

}  // namespace

H5File::H5File(const std::string& path, MPI_Comm comm, const std::string& start_from)
    : path_(path), uncaught_(std::uncaught_exceptions()) {
  MPI_Comm_dup(comm, &comm_);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  long long pid = getpid();  // one temporary name: rank 0's pid
  MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, comm_);
  temp_ = path_ + kTempInfix + std::to_string(pid);
  Quiet quiet;
  Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);  // collective (it duplicates comm_): on every rank
  std::string why;
  if (!fapl.ok() || H5Pset_fapl_mpio(fapl, comm_, MPI_INFO_NULL) < 0 || H5Pset_all_coll_metadata_ops(fapl, true) < 0 ||
      H5Pset_coll_metadata_write(fapl, true) < 0)
    why = "HDF5 file '" + path_ + "': cannot set up MPI-IO access: " + hdf5_message();
  else if (rank_ == 0)
    why = make_temporary(path_, temp_, start_from, &planned_, &reserved_);
  int64_t sizes[2] = {planned_, reserved_};
  MPI_Bcast(sizes, 2, MPI_INT64_T, 0, comm_);
  planned_ = sizes[0], reserved_ = sizes[1];
  try {
    harness::agree(why, comm_);  // rank 0's temporary is made before any rank opens it
    file_ = start_from.empty() ? H5Fcreate(temp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl)
                               : H5Fopen(temp_.c_str(), H5F_ACC_RDWR, fapl);
    if (file_ < 0)
      why = "HDF5 file '" + path_ + "': cannot " + (start_from.empty() ? "create" : "open") + " its temporary '" +
            temp_ + "': " + hdf5_message();
    harness::agree(why, comm_);
  } catch (const harness::AgreedError&) {
    close_file();
    if (rank_ == 0) std::remove(temp_.c_str());  // every rank is past its open (agree() is collective)
    MPI_Comm_free(&comm_);
    throw;
  }
}

H5File::~H5File() {
  if (mpi_finalized()) return;                                                    // nothing collective can run any more
  if (!committed_ && !failed_ && std::uncaught_exceptions() > uncaught_) return;  // this rank fails alone
  if (!committed_) {
    close_file();  // the temporary goes either way
    MPI_Barrier(comm_);
    if (rank_ == 0) std::remove(temp_.c_str());
  }
  MPI_Comm_free(&comm_);
}

std::string H5File::close_file() {
  if (file_ < 0) return "";
  Quiet quiet;
  const herr_t rc = H5Fclose(file_);
  file_ = -1;
  if (rc >= 0) return "";
  const std::string why = hdf5_message();
  return "HDF5 file '" + path_ + "': cannot close '" + temp_ + "'" + (why.empty() ? "" : ": " + why);
}

void H5File::fail(const std::string& what, const std::string& object) const {
  const std::string why = hdf5_message();
  throw std::runtime_error("HDF5 file '" + path_ + "': " + what + " '" + object + "'" +
                           (why.empty() ? "" : ": " + why));
}

void H5File::agree(const std::string& why) {
  try {
    harness::agree(why, comm_);
  } catch (const harness::AgreedError&) {
    failed_ = true;
    throw;
  }
}

template <class Body>
void H5File::collective(const std::string& what, int64_t bytes, Body&& body) {
  reserve(what, bytes);
  std::string why;
  try {
    body();
  } catch (const std::exception& e) {
    why = e.what();
  }
  agree(why);
}

void H5File::reserve(const std::string& what, int64_t bytes) {
  planned_ += bytes;  // the same on every rank: so are the members' arguments
  const int64_t need = planned_ + kMargin;
  if (need <= reserved_) return;  // the same verdict on every rank: no call at all
  std::string why;
  int64_t got = need;
  if (rank_ == 0) {
    why = reserve_on_disk(temp_, need, need + std::max(kAhead, need / 8), &got);
    if (!why.empty()) why = no_room(path_, what, temp_, need, why);
  }
  agree(why);
  MPI_Bcast(&got, 1, MPI_INT64_T, 0, comm_);
  reserved_ = got;
}

int64_t H5File::link_bytes(const std::string& parent, const std::string& name, bool parent_exists) {
  // A group's local heap of names grows by doubling: by up to twice what it holds, and the
  // heap holds up to twice its names.
  const int64_t names = parent_exists ? names_bytes(file_, parent.empty() ? "/" : parent) : 0;
  return kLinkBytes + 2 * align8(int64_t(name.size()) + 1) + 4 * names;
}

int64_t H5File::new_path_bytes(const std::string& path, bool group) {
  Quiet quiet;
  int64_t bytes = 0;
  bool missing = false;  // once a component is missing, so are the ones below it
  each_component(path, [&](const std::string& parent, const std::string& name, const std::string& prefix) {
    const bool parent_exists = !missing;
    missing = missing || H5Lexists(file_, prefix.c_str(), H5P_DEFAULT) <= 0;
    if (missing) bytes += link_bytes(parent, name, parent_exists) + (prefix != path || group ? kGroupBytes : 0);
  });
  H5Eclear2(H5E_DEFAULT);  // a failed look-up is a missing object here
  return bytes;
}

void H5File::create_group(const std::string& group) {
  if (file_ < 0) throw std::logic_error("HDF5 file '" + path_ + "': create_group '" + group + "' after commit");
  collective("group '" + group + "'", new_path_bytes(group, true), [&] {
    Quiet quiet;
    each_component(group, [&](const std::string&, const std::string&, const std::string& prefix) {
      const htri_t there = H5Lexists(file_, prefix.c_str(), H5P_DEFAULT);
      if (there < 0) fail("cannot look up group", prefix);
      if (!there) {
        Id g(H5Gcreate2(file_, prefix.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
        if (!g.ok()) fail("cannot create group", prefix);
      }
    });
  });
}

namespace {

// Writes the scalar attribute `name` of type `type` on `object`, replacing one already there.
template <class Fail>
void write_attr(hid_t file, const std::string& object, const std::string& name, hid_t type, const void* value,
                Fail&& fail) {
  const std::string what = object + "@" + name;
  Id obj(H5Oopen(file, object.c_str(), H5P_DEFAULT), H5Oclose);
  if (!obj.ok()) fail("cannot open the object of attribute", what);
  const htri_t there = H5Aexists(obj, name.c_str());
  if (there < 0 || (there > 0 && H5Adelete(obj, name.c_str()) < 0)) fail("cannot replace attribute", what);
  Id space(H5Screate(H5S_SCALAR), H5Sclose);
  Id attr(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!space.ok() || !attr.ok()) fail("cannot create attribute", what);
  if (H5Awrite(attr, type, value) < 0) fail("cannot write attribute", what);
}

// The variable-length UTF-8 string type (-1 when it cannot be made).
hid_t string_type() {
  const hid_t t = H5Tcopy(H5T_C_S1);
  if (t >= 0 && (H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0)) {
    H5Tclose(t);
    return -1;
  }
  return t;
}

// What a dataset of `data` bytes adds, besides its links: object header, datatype (a
// compound: each member's too), data.
int64_t dataset_bytes(const std::vector<Column>& columns, int64_t data) {
  int64_t type = 64;
  for (const Column& c : columns) type += align8(int64_t(c.name.size()) + 1) + 48;
  return kHeaderBytes + 2 * type + data;
}

// What an attribute adds: its message, and a string's object in the global heap.
int64_t attr_bytes(const std::string& name, const std::string* text) {
  return kAttrBytes + 2 * align8(int64_t(name.size()) + 1) + (text ? 2 * (align8(int64_t(text->size()) + 1) + 16) : 0);
}

}  // namespace

void H5File::put_attr(const std::string& object, const std::string& name, hid_t type, const void* value,
                      const std::string* text) {
  if (file_ < 0) throw std::logic_error("HDF5 file '" + path_ + "': set_attr '" + name + "' after commit");
  const std::string what = object + "@" + name;
  collective("attribute '" + what + "'", attr_bytes(name, text), [&] {
    Quiet quiet;
    if (type < 0) fail("cannot make the type of attribute", what);
    write_attr(file_, object, name, type, value, [this](const std::string& w, const std::string& o) { fail(w, o); });
  });
}

void H5File::set_attr(const std::string& object, const std::string& name, const std::string& value) {
  Quiet quiet;
  Id type(string_type(), H5Tclose);
  const char* p = value.c_str();
  put_attr(object, name, type, &p, &value);
}

void H5File::set_attr(const std::string& object, const std::string& name, const char* value) {
  set_attr(object, name, std::string(value));
}

void H5File::set_attr(const std::string& object, const std::string& name, int64_t value) {
  put_attr(object, name, H5T_STD_I64LE, &value, nullptr);
}

void H5File::set_attr(const std::string& object, const std::string& name, double value) {
  put_attr(object, name, H5T_IEEE_F64LE, &value, nullptr);
}

template <class T>
void H5File::write_rows(const std::string& dset, int64_t rows, int64_t cols, const std::vector<int64_t>& row_index,
                        const T* data) {
  if (file_ < 0) throw std::logic_error("HDF5 file '" + path_ + "': write of dataset '" + dset + "' after commit");
  // Checked on every rank, then agreed on, so that all ranks throw together (no rank is
  // left waiting in a collective call).
  std::string why;
  if (rows < 0 || cols < 0) why = "negative shape";
  const int64_t n = int64_t(row_index.size());
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) { return row_index[size_t(a)] < row_index[size_t(b)]; });
  std::vector<int64_t> sorted(static_cast<size_t>(n));
  for (int64_t i = 0; i < n && why.empty(); ++i) {
    sorted[size_t(i)] = row_index[size_t(order[size_t(i)])];
    if (sorted[size_t(i)] < 0 || sorted[size_t(i)] >= rows)
      why = "row " + std::to_string(sorted[size_t(i)]) + " outside [0, " + std::to_string(rows) + ")";
    else if (i > 0 && sorted[size_t(i)] == sorted[size_t(i) - 1])
      why = "row " + std::to_string(sorted[size_t(i)]) + " given twice";
  }
  if (n > 0 && data == nullptr && why.empty()) why = "no data";
  const std::string head = "HDF5 file '" + path_ + "': dataset '" + dset + "': ";
  agree(why.empty() ? "" : head + "rank " + std::to_string(rank_) + ": " + why);
  int64_t total = n;
  MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_INT64_T, MPI_SUM, comm_);
  agree(rank_ == 0 && total != rows
            ? head + "the ranks give " + std::to_string(total) + " rows in all, the dataset has " + std::to_string(rows)
            : "");
  // HDF5 moves a selection in increasing file order: hand it the rows in that order.
  const int64_t w = std::max<int64_t>(cols, 1);
  const bool in_order = std::is_sorted(row_index.begin(), row_index.end());
  std::vector<T> packed;
  if (!in_order) {
    packed.resize(size_t(n * w));
    for (int64_t i = 0; i < n; ++i)
      std::copy(data + order[size_t(i)] * w, data + (order[size_t(i)] + 1) * w, packed.begin() + i * w);
  }
  write_selected(dset, rows, cols, sorted, in_order ? data : packed.data());
}

template <class T>
void H5File::write_replicated(const std::string& dset, int64_t rows, int64_t cols, const T* data) {
  if (file_ < 0) throw std::logic_error("HDF5 file '" + path_ + "': write of dataset '" + dset + "' after commit");
  agree(rank_ == 0 && (rows < 0 || cols < 0) ? "HDF5 file '" + path_ + "': dataset '" + dset + "': negative shape"
                                             : "");
  std::vector<int64_t> all;
  if (rank_ == 0) {
    all.resize(size_t(rows));
    std::iota(all.begin(), all.end(), int64_t(0));
  }
  write_selected(dset, rows, cols, all, rank_ == 0 ? data : nullptr);
}

template <class T>
void H5File::write_selected(const std::string& dset, int64_t rows, int64_t cols,
                            const std::vector<int64_t>& sorted_rows, const T* packed) {
  const int64_t w = std::max<int64_t>(cols, 1);
  const int64_t bytes = dataset_bytes({}, rows * w * int64_t(sizeof(T))) + new_path_bytes(dset, false);
  collective("dataset '" + dset + "'", bytes, [&] {
    Quiet quiet;
    const int rank = cols == 0 ? 1 : 2;
    const hsize_t dims[2] = {hsize_t(rows), hsize_t(cols)};
    Id fspace(H5Screate_simple(rank, dims, nullptr), H5Sclose);
    Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    if (!fspace.ok() || !lcpl.ok() || !dcpl.ok() || H5Pset_create_intermediate_group(lcpl, 1) < 0 ||
        H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0)
      fail("cannot describe dataset", dset);
    Id d(H5Dcreate2(file_, dset.c_str(), file_type<T>(), fspace, lcpl, dcpl, H5P_DEFAULT), H5Dclose);
    if (!d.ok()) fail("cannot create dataset", dset);
    if (rows == 0) return;  // an empty dataset has no storage to write to (the same on every rank)

    // The rows as hyperslabs OR-ed together: each run of consecutive rows is a block, and
    // equal blocks at a constant stride (a striped layout) go in one call.
    const Runs runs = runs_of(sorted_rows);
    const int64_t n = int64_t(sorted_rows.size());
    if (runs.empty() && H5Sselect_none(fspace) < 0) fail("cannot select no rows of dataset", dset);
    for (size_t i = 0; i < runs.size();) {
      size_t k = i + 1;
      const int64_t len = runs[i].second;
      const int64_t stride = k < runs.size() ? runs[k].first - runs[i].first : 1;
      while (k < runs.size() && runs[k].second == len && runs[k].first - runs[k - 1].first == stride) ++k;
      const hsize_t start[2] = {hsize_t(runs[i].first), 0}, step[2] = {hsize_t(k - i > 1 ? stride : 1), 1},
                    count[2] = {hsize_t(k - i), 1}, block[2] = {hsize_t(len), hsize_t(cols)};
      if (H5Sselect_hyperslab(fspace, i == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, start, step, count, block) < 0)
        fail("cannot select the rows of dataset", dset);
      i = k;
    }
    const hsize_t mdims[1] = {hsize_t(std::max<int64_t>(n * w, 1))};
    Id mspace(H5Screate_simple(1, mdims, nullptr), H5Sclose);
    if (!mspace.ok() || (n == 0 && H5Sselect_none(mspace) < 0)) fail("cannot describe the local rows of dataset", dset);
    Id dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
    if (!dxpl.ok() || H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE) < 0)
      fail("cannot set collective transfer for", dset);
    const T dummy{};
    if (H5Dwrite(d, mem_type<T>(), mspace, fspace, dxpl, n > 0 ? packed : &dummy) < 0)
      fail("cannot write dataset", dset);
  });
}

int64_t H5File::write_table(const std::string& dset, const std::vector<Column>& columns, size_t row_bytes,
                            const void* rows, int64_t n) {
  if (file_ < 0) throw std::logic_error("HDF5 file '" + path_ + "': write of table '" + dset + "' after commit");
  int64_t first = 0, total = 0;
  MPI_Exscan(&n, &first, 1, MPI_INT64_T, MPI_SUM, comm_);
  if (rank_ == 0) first = 0;
  MPI_Allreduce(&n, &total, 1, MPI_INT64_T, MPI_SUM, comm_);
  const int64_t bytes = dataset_bytes(columns, total * int64_t(row_bytes)) + new_path_bytes(dset, false);
  collective("table '" + dset + "'", bytes, [&] {
    Quiet quiet;
    // The same compound type in memory and in the file (native types, the caller's layout).
    Id type(H5Tcreate(H5T_COMPOUND, row_bytes), H5Tclose);
    if (!type.ok()) fail("cannot describe table", dset);
    for (const Column& c : columns) {
      const hid_t t = c.type == Column::I32   ? H5T_NATIVE_INT32
                      : c.type == Column::I64 ? H5T_NATIVE_INT64
                                              : H5T_NATIVE_DOUBLE;
      if (H5Tinsert(type, c.name.c_str(), c.offset, t) < 0)
        fail("cannot describe column " + c.name + " of table", dset);
    }
    const hsize_t dims[1] = {hsize_t(total)};
    Id fspace(H5Screate_simple(1, dims, nullptr), H5Sclose);
    Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    if (!fspace.ok() || !lcpl.ok() || !dcpl.ok() || H5Pset_create_intermediate_group(lcpl, 1) < 0 ||
        H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0)
      fail("cannot describe table", dset);
    Id d(H5Dcreate2(file_, dset.c_str(), type, fspace, lcpl, dcpl, H5P_DEFAULT), H5Dclose);
    if (!d.ok()) fail("cannot create table", dset);
    if (total == 0) return;
    const hsize_t start[1] = {hsize_t(first)}, count[1] = {hsize_t(n)};
    if ((n > 0 ? H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr) : H5Sselect_none(fspace)) <
        0)
      fail("cannot select the rows of table", dset);
    const hsize_t mdims[1] = {hsize_t(std::max<int64_t>(n, 1))};
    Id mspace(H5Screate_simple(1, mdims, nullptr), H5Sclose);
    if (!mspace.ok() || (n == 0 && H5Sselect_none(mspace) < 0)) fail("cannot describe the local rows of table", dset);
    Id dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
    if (!dxpl.ok() || H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE) < 0)
      fail("cannot set collective transfer for", dset);
    std::vector<char> dummy(row_bytes);
    if (H5Dwrite(d, type, mspace, fspace, dxpl, n > 0 ? rows : dummy.data()) < 0) fail("cannot write table", dset);
  });
  return total;
}

void H5File::commit() {
  if (committed_) return;
  collective("the file's closing", 0, [&] {
    const std::string why = close_file();
    if (!why.empty()) throw std::runtime_error(why);
  });
  // Every rank has closed the file (agreed on): its data is all in the temporary.
  std::string why;
  if (rank_ == 0) {
    release_beyond_end(temp_, reserved_);
    if (std::rename(temp_.c_str(), path_.c_str()) != 0)
      why = "HDF5 file '" + path_ + "': cannot rename '" + temp_ + "' into place: " + std::strerror(errno);
  }
  agree(why);
  committed_ = true;
}

namespace {

// An open file's string attribute ("" when absent or not a string).
std::string string_attr(hid_t f, const std::string& object, const std::string& attr) {
  if (H5Aexists_by_name(f, object.c_str(), attr.c_str(), H5P_DEFAULT) <= 0) return "";
  Id a(H5Aopen_by_name(f, object.c_str(), attr.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  Id t(H5Tcopy(H5T_C_S1), H5Tclose);
  if (!a.ok() || !t.ok() || H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0) return "";
  char* p = nullptr;
  if (H5Aread(a, t, &p) < 0 || !p) return "";
  std::string v(p);
  H5free_memory(p);
  return v;
}

hid_t open_to_read(const std::string& file) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) throw std::runtime_error("HDF5 file '" + file + "': cannot open to read: " + hdf5_message());
  return f;
}

// Whether the file starts with HDF5's signature (minicp's files have no user block before it).
bool has_hdf5_signature(const std::string& file) {
  static const char sig[8] = {'\211', 'H', 'D', 'F', '\r', '\n', '\032', '\n'};
  char head[8] = {};
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  const bool ok = fd >= 0 && ::read(fd, head, sizeof head) == ssize_t(sizeof head) && std::memcmp(head, sig, 8) == 0;
  if (fd >= 0) ::close(fd);
  return ok;
}

}  // namespace

std::string read_string_attr(const std::string& file, const std::string& object, const std::string& attr) {
  Quiet quiet;
  Id f(open_to_read(file), H5Fclose);
  return string_attr(f, object, attr);
}

double read_number_attr(const std::string& file, const std::string& object, const std::string& attr) {
  Quiet quiet;
  Id f(open_to_read(file), H5Fclose);
  double v = std::numeric_limits<double>::quiet_NaN();
  if (H5Aexists_by_name(f, object.c_str(), attr.c_str(), H5P_DEFAULT) <= 0) return v;
  Id a(H5Aopen_by_name(f, object.c_str(), attr.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  Id t(a.ok() ? H5Aget_type(a) : -1, H5Tclose);
  const H5T_class_t c = t.ok() ? H5Tget_class(t) : H5T_NO_CLASS;
  if ((c == H5T_INTEGER || c == H5T_FLOAT) && H5Aread(a, H5T_NATIVE_DOUBLE, &v) < 0)
    v = std::numeric_limits<double>::quiet_NaN();
  return v;
}

std::string kind_mismatch(const std::string& file, const std::string& kind) {
  if (!has_hdf5_signature(file)) return "not an HDF5 file";
  Quiet quiet;
  Id f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!f.ok()) return "an HDF5 file that cannot be opened (" + hdf5_message() + ")";
  const std::string is = string_attr(f, "/", "file_kind");
  if (is == kind) return "";
  return is.empty() ? "an HDF5 file of another kind" : "a " + is + " file";
}

void remove_stale_temporaries(const std::string& path) {
  const std::string dir = harness::parent_dir(path), prefix = harness::base_name(path) + kTempInfix;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    if (name.find_first_not_of("0123456789", prefix.size()) == std::string::npos) ::unlink((dir + "/" + name).c_str());
  }
  ::closedir(d);
}

std::vector<std::string> groups_with_attr(const std::string& file, const std::string& group, const std::string& attr,
                                          const std::string& value) {
  std::vector<std::string> names;
  {
    Quiet quiet;
    Id f(open_to_read(file), H5Fclose);
    if (H5Lexists(f, group.c_str(), H5P_DEFAULT) <= 0) return names;
    Id g(H5Gopen2(f, group.c_str(), H5P_DEFAULT), H5Gclose);
    if (!g.ok()) return names;
    H5Literate(
        g, H5_INDEX_NAME, H5_ITER_INC, nullptr,
        [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
          static_cast<std::vector<std::string>*>(out)->push_back(name);
          return 0;
        },
        &names);
  }
  std::vector<std::string> keep;
  for (const std::string& n : names)
    if (read_string_attr(file, group + "/" + n, attr) == value) keep.push_back(n);
  return keep;
}

std::vector<double> read_dataset(const std::string& file, const std::string& dset, std::vector<int64_t>* dims) {
  Quiet quiet;
  auto fail = [&](const std::string& what) -> void {
    const std::string why = hdf5_message();
    throw std::runtime_error("HDF5 file '" + file + "': " + what + " '" + dset + "'" + (why.empty() ? "" : ": " + why));
  };
  Id f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!f.ok()) fail("cannot open to read");
  Id d(H5Dopen2(f, dset.c_str(), H5P_DEFAULT), H5Dclose);
  if (!d.ok()) fail("cannot open dataset");
  Id space(H5Dget_space(d), H5Sclose);
  const int rank = space.ok() ? H5Sget_simple_extent_ndims(space) : -1;
  if (rank < 0) fail("cannot read the shape of dataset");
  std::vector<hsize_t> h(size_t(rank) + 1);
  H5Sget_simple_extent_dims(space, h.data(), nullptr);
  size_t count = 1;
  if (dims) dims->clear();
  for (int i = 0; i < rank; ++i) {
    count *= size_t(h[size_t(i)]);
    if (dims) dims->push_back(int64_t(h[size_t(i)]));
  }
  std::vector<double> out(count);
  if (count > 0 && H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
    fail("cannot read dataset");
  return out;
}

template void H5File::write_rows<float>(const std::string&, int64_t, int64_t, const std::vector<int64_t>&,
                                        const float*);
template void H5File::write_rows<double>(const std::string&, int64_t, int64_t, const std::vector<int64_t>&,
                                         const double*);
template void H5File::write_rows<int64_t>(const std::string&, int64_t, int64_t, const std::vector<int64_t>&,
                                          const int64_t*);
template void H5File::write_replicated<float>(const std::string&, int64_t, int64_t, const float*);
template void H5File::write_replicated<double>(const std::string&, int64_t, int64_t, const double*);
template void H5File::write_replicated<int64_t>(const std::string&, int64_t, int64_t, const int64_t*);

}  // namespace minicp::record
