// The HDF5 layer (miniapp/record/h5) and the --dump file (miniapp/record/dump).
//   H5File.*  at the rank count it runs with: rows given in any order (scrambled, striped,
//             none on some rank) land at their global index; a file destroyed without
//             commit() leaves nothing under its final name (and an older file there intact);
//             errors name the file and the dataset, and a failure one rank sees is every
//             rank's (harness::AgreedError, reported by that rank), the file still removed.
//   Dump.WriteStack  writes the dump of the small stack of test_layer.cpp (fp64, scheme
//             --scheme at this rank count) to $MINICP_DUMP_FILE (skipped when unset): pass
//             $MINICP_DUMP_PASS (train | prefill | decode, default train), mask
//             $MINICP_DUMP_MASK (causal | full | window | documents, default causal). Each
//             rank reads its rows back; tests/check_dump.py then recomputes the file in numpy.
// Usage: minicp-test-dump [--scheme=NAME] [gtest flags]
#include <gtest/gtest.h>
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "harness/main.hpp"
#include "miniapp/model/layer.hpp"
#include "miniapp/record/dump.hpp"
#include "miniapp/record/h5.hpp"
#include "tests/mpi_util.hpp"
#include "tests/view_util.hpp"

extern std::string g_scheme;  // from test_main.cpp (--scheme=NAME)

namespace {
using namespace minicp;

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

// A file name in the working directory, the same on every rank and unique to this job.
std::string scratch(const std::string& stem) {
  long long pid = test::world_rank() == 0 ? (long long)getpid() : 0;
  MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  return stem + "_" + std::to_string(pid) + ".h5";
}

// What rank 0 sees on the file system, on every rank.
bool exists_on_rank0(const std::string& p) {
  MPI_Barrier(MPI_COMM_WORLD);
  int e = test::world_rank() == 0 ? int(exists(p)) : 0;
  MPI_Bcast(&e, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return e != 0;
}

void remove_on_rank0(const std::string& p) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (test::world_rank() == 0) std::remove(p.c_str());
  MPI_Barrier(MPI_COMM_WORLD);
}

double value(int64_t row, int64_t col) { return double(row) * 1000 + double(col); }

// The data of the rows `rows` of a [R, W] tensor (W == 0: a vector), in that order.
template <class T>
std::vector<T> rows_data(const std::vector<int64_t>& rows, int64_t W) {
  std::vector<T> d;
  for (int64_t r : rows)
    for (int64_t c = 0; c < std::max<int64_t>(W, 1); ++c) d.push_back(T(value(r, c)));
  return d;
}

void expect_all(const std::string& file, const std::string& dset, int64_t R, int64_t W) {
  std::vector<int64_t> dims;
  const std::vector<double> got = record::read_dataset(file, dset, &dims);
  const std::vector<int64_t> shape = W == 0 ? std::vector<int64_t>{R} : std::vector<int64_t>{R, W};
  ASSERT_EQ(dims, shape) << dset;
  const int64_t w = std::max<int64_t>(W, 1);
  int wrong = 0;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < w; ++c)
      if (got[size_t(r * w + c)] != value(r, c) && wrong++ < 5)
        ADD_FAILURE() << dset << "[" << r << ", " << c << "] = " << got[size_t(r * w + c)] << ", expected "
                      << value(r, c);
  EXPECT_EQ(wrong, 0) << dset;
}

TEST(H5File, RowsInAnyOrderLandAtTheirGlobalIndex) {
  const int P = test::world_size(), me = test::world_rank();
  const int64_t R = 37, W = 5;
  // scrambled: row t on rank (7t + 3) mod P, given in decreasing order; rank P-1 gets none
  // when P > 1. striped: row t on rank t mod P, in order (one strided hyperslab).
  // blocks: two blocks per rank, the later one first (zigzag-like).
  std::vector<int64_t> scrambled, striped, blocks;
  for (int64_t t = R - 1; t >= 0; --t)
    if ((P == 1 ? 0 : (7 * t + 3) % (P - 1)) == me) scrambled.push_back(t);
  for (int64_t t = 0; t < R; ++t)
    if (t % P == me) striped.push_back(t);
  const int64_t chunk = (R + 2 * P - 1) / (2 * P);
  for (int part : {2 * P - 1 - me, me})
    for (int64_t t = part * chunk; t < std::min(R, (part + 1) * chunk); ++t) blocks.push_back(t);
  const std::string file = scratch("h5_rows");
  {
    record::H5File f(file, MPI_COMM_WORLD);
    EXPECT_EQ(f.size(), P);
    f.write_rows("/a/scrambled_f64", R, W, scrambled, rows_data<double>(scrambled, W).data());
    f.write_rows("/a/scrambled_f32", R, W, scrambled, rows_data<float>(scrambled, W).data());
    f.write_rows("/a/b/striped", R, W, striped, rows_data<double>(striped, W).data());
    f.write_rows("/blocks", R, W, blocks, rows_data<double>(blocks, W).data());
    f.write_rows("/vector", R, 0, scrambled, rows_data<double>(scrambled, 0).data());
    f.write_rows("/int", R, 0, striped, rows_data<int64_t>(striped, 0).data());
    // Replicated: only rank 0's copy counts (the others pass garbage or nothing).
    std::vector<int64_t> all(R);
    for (int64_t t = 0; t < R; ++t) all[size_t(t)] = t;
    std::vector<double> rep = rows_data<double>(all, W);
    if (me != 0) rep.assign(rep.size(), -1.0);
    f.write_replicated("/replicated", R, W, rep.data());
    f.write_replicated<double>("/empty", 0, W, nullptr);
    f.create_group("/g/h/i");
    f.create_group("/g/h");  // already there: kept
    f.set_attr("/", "s", "text");
    f.set_attr("/g/h", "n", int64_t(3));
    f.set_attr("/a/b/striped", "x", 2.5);
    f.set_attr("/", "s", "replaced");
    EXPECT_FALSE(exists_on_rank0(file)) << "the final name appears only at commit()";
    EXPECT_TRUE(exists_on_rank0(f.temp_path()));
    f.commit();
    EXPECT_TRUE(f.committed());
    EXPECT_FALSE(exists_on_rank0(f.temp_path()));
  }
  ASSERT_TRUE(exists_on_rank0(file));
  for (const char* d : {"/a/scrambled_f64", "/a/scrambled_f32", "/a/b/striped", "/blocks", "/replicated"})
    expect_all(file, d, R, W);
  expect_all(file, "/vector", R, 0);
  expect_all(file, "/int", R, 0);
  std::vector<int64_t> dims;
  EXPECT_TRUE(record::read_dataset(file, "/empty", &dims).empty());
  EXPECT_EQ(dims, (std::vector<int64_t>{0, W}));
  remove_on_rank0(file);
}

TEST(H5File, DestroyedWithoutCommitLeavesNoFile) {
  const std::string file = scratch("h5_uncommitted");
  std::string temp;
  {
    record::H5File f(file, MPI_COMM_WORLD);
    temp = f.temp_path();
    const std::vector<int64_t> rows = test::world_rank() == 0 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{};
    f.write_rows("/x", 2, 3, rows, rows_data<double>(rows, 3).data());
    EXPECT_TRUE(exists_on_rank0(temp));
  }  // no commit()
  EXPECT_FALSE(exists_on_rank0(temp)) << "the temporary must be removed";
  EXPECT_FALSE(exists_on_rank0(file)) << "the final name must never appear";
}

TEST(H5File, FailedWriteKeepsTheOlderFileAndNamesTheDataset) {
  const std::string file = scratch("h5_failed");
  const int me = test::world_rank();
  const std::vector<int64_t> mine = me == 0 ? std::vector<int64_t>{0, 1, 2} : std::vector<int64_t>{};
  {
    record::H5File f(file, MPI_COMM_WORLD);
    f.write_rows("/old", 3, 2, mine, rows_data<double>(mine, 2).data());
    f.commit();
  }
  std::string temp;
  try {
    record::H5File f(file, MPI_COMM_WORLD);
    temp = f.temp_path();
    // Rank 0 gives rows 0, 1 of 3: row 2 is missing on every rank.
    const std::vector<int64_t> short_rows = me == 0 ? std::vector<int64_t>{1, 0} : std::vector<int64_t>{};
    f.write_rows("/tensors/new", 3, 2, short_rows, rows_data<double>(short_rows, 2).data());
    ADD_FAILURE() << "a write missing a row must throw";
    f.commit();
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(file), std::string::npos) << what;
    EXPECT_NE(what.find("/tensors/new"), std::string::npos) << what;
  }
  EXPECT_FALSE(exists_on_rank0(temp));
  ASSERT_TRUE(exists_on_rank0(file));
  expect_all(file, "/old", 3, 2);  // the older file, untouched
  // A row out of range, and a row given twice, are refused too.
  for (const auto& rows : {std::vector<int64_t>{3}, std::vector<int64_t>{0, 0}}) {
    const std::vector<int64_t> r = me == 0 ? rows : std::vector<int64_t>{};
    record::H5File f(file, MPI_COMM_WORLD);
    EXPECT_THROW(f.write_rows("/bad", 3, 2, r, rows_data<double>(r, 2).data()), std::runtime_error);
  }
  expect_all(file, "/old", 3, 2);
  remove_on_rank0(file);
}

TEST(H5File, FailureOnOneRankIsEveryRanks) {
  const std::string file = scratch("h5_agreed");
  const int me = test::world_rank(), last = test::world_size() - 1;
  // The last rank alone gives a row out of range: every rank throws the same error, which
  // names that rank and has it report, and every rank then removes the file together.
  const std::vector<int64_t> mine = me == last ? std::vector<int64_t>{0, 7} : std::vector<int64_t>{};
  std::string temp;
  try {
    record::H5File f(file, MPI_COMM_WORLD);
    temp = f.temp_path();
    f.write_rows("/x", 2, 1, mine, rows_data<double>(mine, 1).data());
    ADD_FAILURE() << "a row out of range must throw";
  } catch (const harness::AgreedError& e) {
    EXPECT_EQ(e.reporter, last);
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(last) + ": row 7 outside [0, 2)"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(exists_on_rank0(temp));
  EXPECT_FALSE(exists_on_rank0(file));
}

TEST(H5File, MissingDirectoryIsNamed) {
  const std::string file = "no_such_directory_" + scratch("x") + "/dump.h5";
  try {
    record::H5File f(file, MPI_COMM_WORLD);
    ADD_FAILURE() << "creating a file in a missing directory must throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
}

// The masks MINICP_DUMP_MASK names at S = 48: a window of 16 tokens, documents of 20, and
// `varlen`, documents of any length (one of a token, one over every rank at np <= 3).
cp::Mask mask_named(const std::string& name) {
  if (name == "varlen") return cp::Mask::documents({3, 1, 30, 9, 5});
  if (name == "window") return cp::Mask::window(16);
  if (name == "documents") return cp::Mask::equal_documents(20);
  return name == "full" ? cp::Mask::full() : cp::Mask::causal();
}

// The small stack of test_layer.cpp: 12 query heads in K/V groups of 3, S = 48.
model::StackConfig small_config(model::Pass pass, const std::string& mask) {
  model::StackConfig c;
  c.shape = {48, 12, 4, 8, 64, 2, 10000, 1e-5};
  c.pass = pass;
  c.attn.mask = mask_named(mask);
  c.attn.seq_len = 48;
  c.attn.decode_tokens = 3;
  c.attn.attn.tile_q = c.attn.attn.tile_k = 8;
  c.attn.ranks = test::world_size();
  c.seed = 7;
  return c;
}

std::string env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

TEST(Dump, WriteStack) {
  const std::string file = env("MINICP_DUMP_FILE", "");
  if (file.empty()) GTEST_SKIP() << "MINICP_DUMP_FILE is not set";
  const std::string pass_name = env("MINICP_DUMP_PASS", "train"), mask = env("MINICP_DUMP_MASK", "causal");
  const model::Pass pass = pass_name == "decode"    ? model::Pass::Decode
                           : pass_name == "prefill" ? model::Pass::Prefill
                                                    : model::Pass::Train;
  ASSERT_EQ(model::to_string(pass), pass_name) << "MINICP_DUMP_PASS";
  ASSERT_TRUE(mask == "causal" || mask == "full" || mask == "window" || mask == "documents" || mask == "varlen")
      << mask;
  const model::StackConfig cfg = small_config(pass, mask);
  const cp::SchemeInfo& info = cp::find(g_scheme);
  const std::string why = cp::check(info, model::attention_config(cfg));
  ASSERT_TRUE(why.empty()) << why;
  EXPECT_EQ(cfg.attn.mask.name(), mask == "varlen" ? std::string("documents") : mask);

  remove_on_rank0(file);  // a stale file from an earlier run must not pass the check
  auto world = comm::make_mpi_comm(comm::Progress::None);
  model::Stack<double> st(cfg, info, *world);
  cp::Context ctx{*world, model::attention_config(cfg)};
  st.forward(ctx);
  if (pass == model::Pass::Train) st.backward(ctx);
  record::write_dump(file, st, cfg, g_scheme, *world);
  ASSERT_TRUE(exists_on_rank0(file));

  // Each rank finds its own rows at their global index.
  const int64_t C = cfg.shape.hidden;
  const std::vector<int64_t>& rows = st.rows();
  const int64_t first = pass == model::Pass::Decode ? cfg.attn.seq_len : 0;
  std::vector<std::pair<const char*, model::View2<double>>> act = {{"/tensors/x", st.x()}, {"/tensors/y", st.y()}};
  if (pass == model::Pass::Train) act.insert(act.end(), {{"/tensors/dy", st.dy()}, {"/tensors/dx", st.dx()}});
  for (const auto& [name, view] : act) {
    const std::vector<double> file_data = record::read_dataset(file, name), mine = test::to_vec(view);
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t c = 0; c < C; ++c)
        ASSERT_EQ(file_data[size_t((rows[i] - first) * C + c)], mine[i * size_t(C) + size_t(c)])
            << name << " row " << rows[i];
  }
  if (pass == model::Pass::Decode) {
    const int64_t KD = int64_t(cfg.shape.kv_heads) * cfg.shape.head_dim;
    const std::vector<double> k = record::read_dataset(file, "/tensors/layers/1/cache_k"),
                              mine = test::to_vec(st.cache_k(1));
    ASSERT_EQ(st.cache_rows().size() * size_t(KD), mine.size());
    for (size_t i = 0; i < st.cache_rows().size(); ++i)
      for (int64_t j = 0; j < KD; ++j)
        ASSERT_EQ(k[size_t(st.cache_rows()[i] * KD + j)], mine[i * size_t(KD) + size_t(j)]);
  }
}

TEST(Dump, TrainNeedsTheBackward) {
  const model::StackConfig cfg = small_config(model::Pass::Train, "causal");
  const cp::SchemeInfo& info = cp::find("ring");
  auto world = comm::make_mpi_comm(comm::Progress::None);
  model::Stack<float> st(cfg, info, *world);
  cp::Context ctx{*world, model::attention_config(cfg)};
  st.forward(ctx);
  const std::string file = scratch("dump_no_backward");
  EXPECT_THROW(record::write_dump(file, st, cfg, "ring", *world), std::logic_error);
  EXPECT_FALSE(exists_on_rank0(file));
}

}  // namespace
