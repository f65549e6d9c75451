// The one HDF5 writer of miniCP: a thin RAII wrapper over the parallel HDF5 C API (MPI-IO).
// A file is created collectively under a temporary name in the directory of its final path
// and renamed into place only by commit(); destroyed without commit (an exception, an early
// return) it removes the temporary, so no truncated file ever appears under the final name
// and a file already there stays untouched. A process killed outright can leave the
// temporary (<path>.tmp.<pid of rank 0>), never a partial <path>.
//
// Every member is COLLECTIVE over the communicator the file was created on: every rank calls
// it, in the same order, with the same names, shapes and attribute values (HDF5 metadata is
// written by all ranks alike); only the data of a write differs per rank.
//
// A full disk is an error, never a hang. Parallel HDF5 writes its metadata from rank 0 only,
// so a write that fails for want of space fails on one rank, inside a call the other ranks
// are still in. Hence, before each member writes, rank 0 reserves on disk (fallocate, the
// file's size kept) all the file may take once the member is done: what it started with
// (nothing, or the copy) plus, for each member so far, a safe estimate of what it adds (its
// data exactly; for its object headers, heaps and links about twice what HDF5 was measured
// to add, see docs/results-file.md) plus a margin for what HDF5 allocates in blocks; every rank learns
// the verdict before any collective write, and writes below the reserved end cannot run out
// of space. Where the file system cannot reserve (no fallocate), its free space is checked
// instead. After each member the ranks agree on its success. Either failure is a
// harness::AgreedError on every rank ("HDF5 file 'P': no room for dataset '/x': its
// temporary 'T' needs N bytes: No space left on device", or HDF5's reason); the file is then
// closed and removed collectively and the job ends cleanly (harness/main.hpp). commit()
// gives back what was reserved beyond the file's end.
//
// The destructor of an uncommitted file is collective too, except while an error that was
// not agreed on unwinds one rank: that rank then leaves the file (the job aborts, and the
// next run removes the temporary) rather than wait in a call the others never make.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace minicp::record {

// A column of a table (an HDF5 compound dataset): its name, type and byte offset in the
// row struct the caller writes.
struct Column {
  enum Type { I32, I64, F64 };
  std::string name;
  Type type;
  size_t offset;
};

class H5File {
 public:
  // Creates `path`'s temporary (truncating any stale one); the directory must exist. With
  // start_from, the temporary starts as a copy of that existing HDF5 file (rank 0 copies it)
  // and is opened for writing: a file grows by whole transactions (copy, add, commit).
  H5File(const std::string& path, MPI_Comm comm, const std::string& start_from = "");
  ~H5File();
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;

  const std::string& path() const { return path_; }       // the final name
  const std::string& temp_path() const { return temp_; }  // where it is written until commit()
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Creates the group `group` ("/a/b/c") and any missing parent; an existing one is kept.
  void create_group(const std::string& group);

  // A scalar attribute `name` on the object `object` ("/" for the root, or a group or
  // dataset path, which must exist). Strings are variable-length UTF-8.
  void set_attr(const std::string& object, const std::string& name, const std::string& value);
  void set_attr(const std::string& object, const std::string& name, const char* value);
  void set_attr(const std::string& object, const std::string& name, int64_t value);
  void set_attr(const std::string& object, const std::string& name, int value) {
    set_attr(object, name, int64_t(value));
  }
  void set_attr(const std::string& object, const std::string& name, double value);

  // Creates the dataset `dset` [rows, cols] (cols == 0: a vector [rows]; parent groups are
  // created) and writes it collectively: this rank supplies the global rows `row_index`, in
  // any order, from `data` (row-major, row_index.size() x max(cols, 1) values, row i of
  // data being global row row_index[i]). The rows of all ranks together must be every row
  // exactly once (a rank may have none; it still takes part). T: float, double, int64_t.
  template <class T>
  void write_rows(const std::string& dset, int64_t rows, int64_t cols, const std::vector<int64_t>& row_index,
                  const T* data);
  // Creates the dataset `dset` [rows, cols] (cols == 0: [rows]) and writes rank 0's `data`
  // (row-major) collectively: a tensor every rank holds the same copy of (weights). The
  // other ranks' data is not read (it may be null).
  template <class T>
  void write_replicated(const std::string& dset, int64_t rows, int64_t cols, const T* data);

  // Creates the table `dset` (a 1-D compound dataset with `columns`, rows of `row_bytes`) and
  // writes it collectively: each rank appends its n rows, rank 0's first, then rank 1's, ...
  // Returns the total rows. A rank may have none; it still takes part.
  int64_t write_table(const std::string& dset, const std::vector<Column>& columns, size_t row_bytes, const void* rows,
                      int64_t n);

  // Closes the file and renames the temporary to the final path (rank 0, after every rank
  // has closed it); afterwards the object holds nothing. Throws if the rename failed.
  void commit();
  bool committed() const { return committed_; }

 private:
  std::string close_file();  // "" or HDF5's reason; collective; safe to call twice
  [[noreturn]] void fail(const std::string& what, const std::string& object) const;
  // A member's steps: the reservation of what it may add, `bytes` (for `what`, named in the
  // message), the body (HDF5 calls that throw on failure), the agreement.
  template <class Body>
  void collective(const std::string& what, int64_t bytes, Body&& body);
  void reserve(const std::string& what, int64_t bytes);
  void put_attr(const std::string& object, const std::string& name, int64_t type, const void* value,
                const std::string* text);  // text: a string's value, else null
  void agree(const std::string& why);      // harness::agree, remembering that the ranks failed together
  // What HDF5 may add to the file (bytes) for the links and groups of `path` that do not
  // exist yet (the last component a group when `group`).
  int64_t new_path_bytes(const std::string& path, bool group);
  int64_t link_bytes(const std::string& parent, const std::string& name, bool parent_exists);
  template <class T>
  void write_selected(const std::string& dset, int64_t rows, int64_t cols, const std::vector<int64_t>& sorted_rows,
                      const T* packed);

  std::string path_, temp_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  int64_t file_ = -1;     // hid_t
  int64_t planned_ = 0;   // what the file may take once the members so far are done (every rank alike)
  int64_t reserved_ = 0;  // the temporary's first bytes allocated on disk (every rank knows it)
  bool committed_ = false;
  bool failed_ = false;  // an AgreedError was thrown: every rank unwinds past the file together
  int uncaught_ = 0;     // std::uncaught_exceptions() at construction
};

// Removes the temporaries "<path>.tmp.<pid>" that runs killed in the middle of a transaction
// left beside path. Only for the owner of path (see harness/lock.hpp): once it holds the lock,
// no live run can be writing one. Serial.
void remove_stale_temporaries(const std::string& path);

// "" when the existing file `file` is a minicp file of kind `kind` (its root text attribute
// file_kind), else what it is instead, for a message: "not an HDF5 file" (no HDF5 signature: text, empty),
// "an HDF5 file that cannot be opened (<HDF5's reason>)" (e.g. truncated), "a <kind> file",
// "an HDF5 file of another kind". Serial, any rank.
std::string kind_mismatch(const std::string& file, const std::string& kind);

// The names of the groups below `group` of an HDF5 file whose string attribute `attr` equals
// `value` (serially, any rank; empty when the group does not exist), and a string attribute
// of an object ("" when absent). For reading back a results file (--resume).
std::vector<std::string> groups_with_attr(const std::string& file, const std::string& group, const std::string& attr,
                                          const std::string& value);
std::string read_string_attr(const std::string& file, const std::string& object, const std::string& attr);
// A numeric attribute as a double (NaN when absent or not numeric).
double read_number_attr(const std::string& file, const std::string& object, const std::string& attr);

// Reads a whole dataset (any rank, serially; e.g. a test reading back what it wrote):
// values converted to double, row-major; dims gets its shape.
std::vector<double> read_dataset(const std::string& file, const std::string& dset,
                                 std::vector<int64_t>* dims = nullptr);

}  // namespace minicp::record
