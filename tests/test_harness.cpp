// harness/ against hand-computed values: the figures of merit (quartile rule, paired
// overlap, imbalance), integer option checks and their messages, output path checks and the
// JSON writer, the memory message. One process, no MPI (Args built as main_serial does).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "harness/blas.hpp"
#include "harness/cli.hpp"
#include "harness/input.hpp"
#include "harness/lock.hpp"
#include "harness/main.hpp"
#include "harness/memory.hpp"
#include "harness/output.hpp"
#include "harness/stats.hpp"

namespace hn = minicp::harness;

namespace {

std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const hn::UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

// A fresh directory under $TMPDIR (or /tmp), removed with its files at the end of the test.
struct TempDir {
  std::string path;
  TempDir() {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/minicp-harness-test.XXXXXX";
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  int entries() const {
    FILE* p = ::popen(("ls -A '" + path + "' | wc -l").c_str(), "r");
    int n = -1;
    if (p && std::fscanf(p, "%d", &n) != 1) n = -1;
    if (p) ::pclose(p);
    return n;
  }
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

hn::Args args_of(std::vector<std::string> v) { return hn::Args("prog", std::move(v), 0, 1, false); }

}  // namespace

TEST(HarnessStats, QuartilesOddAndEven) {
  const hn::Quartiles odd = hn::quartiles({5, 1, 3, 2, 4});  // sorted 1 2 3 4 5: indices 1, 2, 3
  EXPECT_EQ(odd.q1, 2);
  EXPECT_EQ(odd.median, 3);
  EXPECT_EQ(odd.q3, 4);
  const hn::Quartiles even = hn::quartiles({40, 10, 30, 20});  // sorted 10 20 30 40: indices 1, 2, 3
  EXPECT_EQ(even.q1, 20);
  EXPECT_EQ(even.median, 30);  // the upper of the two middle samples
  EXPECT_EQ(even.q3, 40);
  const hn::Quartiles one = hn::quartiles({7});
  EXPECT_EQ(one.q1, 7);
  EXPECT_EQ(one.q3, 7);
  EXPECT_TRUE(std::isnan(hn::median({})));
  EXPECT_EQ(hn::median({3, 1, 2}), 2);
}

TEST(HarnessStats, PairedOverlap) {
  // Differences 0.1 0.2 0.05 0.3 0.15 -> sorted 0.05 0.1 0.15 0.2 0.3: Q1 0.1, median 0.15,
  // Q3 0.2. Full reps sorted 1.0 1.1 1.15 1.2 1.3: spread Q3 - Q1 = 0.1 < t_comm 0.4.
  const hn::Overlap o = hn::paired_overlap({1.0, 1.2, 1.1, 1.3, 1.15}, {0.9, 1.0, 1.05, 1.0, 1.0}, 0.4);
  ASSERT_TRUE(o.measured()) << o.unresolved;
  EXPECT_NEAR(o.exposed_s, 0.15, 1e-12);
  EXPECT_NEAR(o.overlap, 0.625, 1e-12);    // 1 - 0.15 / 0.4
  EXPECT_NEAR(o.overlap_q1, 0.5, 1e-12);   // 1 - 0.2 / 0.4
  EXPECT_NEAR(o.overlap_q3, 0.75, 1e-12);  // 1 - 0.1 / 0.4
  EXPECT_NEAR(o.spread_s, 0.1, 1e-12);
  EXPECT_TRUE(std::isnan(o.clamped_from));
  // Four pairs: the overlap, but no quartiles (kQuartileSamples).
  const hn::Overlap four = hn::paired_overlap({1.0, 1.2, 1.1, 1.3}, {0.9, 1.0, 1.05, 1.0}, 0.4);
  EXPECT_NEAR(four.overlap, 1 - 0.2 / 0.4, 1e-12);  // sorted 0.05 0.1 0.2 0.3: median index 2
  EXPECT_TRUE(std::isnan(four.overlap_q1) && std::isnan(four.overlap_q3));
  EXPECT_FALSE(hn::paired_overlap({}, {}, 0.4).measured());
  EXPECT_FALSE(hn::paired_overlap({1.0, 1.1}, {0.5, 0.6}, 0.0).measured());
  EXPECT_TRUE(std::isnan(hn::not_measured().exposed_s));
  EXPECT_THROW(hn::paired_overlap({1.0, 2.0}, {1.0}, 1.0), std::invalid_argument);
}

TEST(HarnessStats, OverlapResolution) {
  // The comm-only time within the spread of the full reps: NaN, with the reason.
  const hn::Overlap noisy = hn::paired_overlap({1.0, 1.2, 1.1, 1.3, 1.15}, {0.9, 1.0, 1.05, 1.0, 1.0}, 0.05);
  EXPECT_FALSE(noisy.measured());
  EXPECT_NE(noisy.unresolved.find("within the spread"), std::string::npos) << noisy.unresolved;
  EXPECT_NEAR(noisy.exposed_s, 0.15, 1e-12);  // still reported
  const hn::Overlap one = hn::paired_overlap({1.0}, {0.9}, 0.4);
  EXPECT_FALSE(one.measured());
  EXPECT_NE(one.unresolved.find("one rep"), std::string::npos) << one.unresolved;
  // Raw 1.1 with a noise band of 0.02 / 0.1 = 0.2: consistent with 1, set to it.
  const hn::Overlap near = hn::paired_overlap({1.0, 1.02, 1.01}, {1.01, 1.03, 1.02}, 0.1);
  EXPECT_DOUBLE_EQ(near.overlap, 1.0);
  EXPECT_NEAR(near.clamped_from, 1.1, 1e-9);
  // Raw 1.5 with a band of 0.001 / 0.1: outside by more than its noise, left for the range check.
  const hn::Overlap far = hn::paired_overlap({1.0, 1.001, 1.0005}, {1.05, 1.051, 1.0505}, 0.1);
  EXPECT_NEAR(far.overlap, 1.5, 1e-9);
  EXPECT_TRUE(std::isnan(far.clamped_from));
}

TEST(HarnessStats, SpreadAndSlowest) {
  EXPECT_TRUE(std::isnan(hn::spread({1.0})));
  EXPECT_DOUBLE_EQ(hn::spread({3, 1, 2}), 2);                // fewer than 5: max - min
  EXPECT_DOUBLE_EQ(hn::spread({5, 1, 3, 2, 4}), 2);          // Q3 4 - Q1 2
  EXPECT_TRUE(std::isnan(hn::slowest_ratio({10.6, 14.8})));  // two reps: the median is the slowest
  EXPECT_DOUBLE_EQ(hn::slowest_ratio({1, 4, 2}), 2);         // 4 / median 2
}

TEST(HarnessBlas, CoreTiers) {
  EXPECT_EQ(hn::isa_of_core("Prescott"), hn::Isa::Sse);
  EXPECT_EQ(hn::isa_of_core("Core2"), hn::Isa::Sse);
  EXPECT_EQ(hn::isa_of_core("Sandybridge"), hn::Isa::Avx);
  EXPECT_EQ(hn::isa_of_core("Haswell"), hn::Isa::Avx2);
  EXPECT_EQ(hn::isa_of_core("zen"), hn::Isa::Avx2);  // a non-DYNAMIC_ARCH build names its target in lower case
  EXPECT_EQ(hn::isa_of_core("SkylakeX"), hn::Isa::Avx512);
  EXPECT_EQ(hn::isa_of_core("Cooperlake"), hn::Isa::Avx512);
  EXPECT_EQ(hn::isa_of_core(""), hn::Isa::Unknown);
  EXPECT_EQ(hn::core_for(hn::Isa::Avx512), "SkylakeX");
  EXPECT_EQ(hn::core_for(hn::Isa::Avx2), "Haswell");
  EXPECT_EQ(hn::core_for(hn::Isa::Sse), "");
}

TEST(HarnessBlas, CoreSelection) {
  // A generic core on an AVX-512 or AVX2 CPU is replaced; the user's setting never is.
  EXPECT_EQ(hn::core_to_select("Prescott", hn::Isa::Avx512, false), "SkylakeX");
  EXPECT_EQ(hn::core_to_select("Prescott", hn::Isa::Avx2, false), "Haswell");
  EXPECT_EQ(hn::core_to_select("Haswell", hn::Isa::Avx512, false), "SkylakeX");
  EXPECT_EQ(hn::core_to_select("Prescott", hn::Isa::Avx512, true), "");
  EXPECT_EQ(hn::core_to_select("SkylakeX", hn::Isa::Avx512, false), "");
  EXPECT_EQ(hn::core_to_select("Cooperlake", hn::Isa::Avx512, false), "");
  EXPECT_EQ(hn::core_to_select("Prescott", hn::Isa::Sse, false), "");
  EXPECT_EQ(hn::core_to_select("Prescott", hn::Isa::Unknown, false), "");
}

TEST(HarnessStats, Imbalance) {
  EXPECT_DOUBLE_EQ(hn::imbalance({1, 2, 3}), 1.5);  // max 3 / mean 2
  EXPECT_DOUBLE_EQ(hn::imbalance({4, 4}), 1.0);
  EXPECT_DOUBLE_EQ(hn::imbalance({0, 0}), 1.0);
  EXPECT_TRUE(std::isnan(hn::imbalance({})));
}

TEST(HarnessCli, ParseIntMessages) {
  EXPECT_EQ(hn::parse_int("--seq", "42", 1, hn::kNoMax), 42);
  EXPECT_EQ(usage_error([] { hn::parse_int("--seq", "0", 1, hn::kNoMax); }), "--seq 0: must be >= 1");
  EXPECT_EQ(usage_error([] { hn::parse_int("--seq", "x1", 1, hn::kNoMax); }), "--seq x1: must be an integer >= 1");
  EXPECT_EQ(usage_error([] { hn::parse_int("--seq", "99999999999999999999", 1, hn::kNoMax); }),
            "--seq 99999999999999999999: must be between 1 and 9223372036854775807");
  EXPECT_EQ(usage_error([] { hn::parse_int("--causal", "5", 0, 1); }), "--causal 5: must be 0 or 1");
  EXPECT_EQ(usage_error([] { hn::parse_int("-f/--stepfactor", "1", 2, 64); }),
            "-f/--stepfactor 1: must be between 2 and 64");
  EXPECT_EQ(hn::flag_label("-n, --iters"), "-n/--iters");
}

TEST(HarnessCli, IntOptionsAreCheckedBeforeNarrowing) {
  CLI::App app{"test", "prog"};
  int heads = 8;
  int64_t seq = 4;
  std::vector<int64_t> dims = {64};
  hn::add_int(app, "--heads", heads, 1, hn::kNoMax, "heads");
  hn::add_int(app, "--seq", seq, 1, hn::kNoMax, "seq");
  hn::add_int_list(app, "--head-dim", dims, 2, hn::kNoMax, "dims");
  EXPECT_EQ(usage_error([&] {
              hn::parse(app, args_of({"prog", "--heads=4294967297"}));
            }),
            "--heads 4294967297: must be between 1 and 2147483647");
  EXPECT_EQ(heads, 8);
  hn::parse(app, args_of({"prog", "--seq", "9223372036854775807", "--head-dim=2,4"}));
  EXPECT_EQ(seq, INT64_MAX);
  EXPECT_EQ(dims, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(usage_error([&] {
              hn::parse(app, args_of({"prog", "--head-dim=2,"}));
            }),
            "--head-dim '2,': must be a comma list of integers >= 2");
  EXPECT_NE(usage_error([&] { hn::parse(app, args_of({"prog", "--bogus"})); }).find("(see --help)"), std::string::npos);
  CLI::App snake{"test", "prog"};
  int x = 0;
  hn::add_int(snake, "--poll_us", x, 0, 1, "not kebab-case");
  EXPECT_THROW(hn::parse(snake, args_of({"prog"})), std::logic_error);
}

TEST(HarnessOutput, PathProblems) {
  TempDir d;
  const std::string file = d.path + "/x.json";
  EXPECT_EQ(hn::output_path_problem("--json", file), "");
  EXPECT_EQ(hn::output_path_problem("--json", d.path),
            "--json " + d.path + ": is a directory; give the name of a file to write");
  EXPECT_EQ(hn::output_path_problem("--json", d.path + "/no/x.json"),
            "--json " + d.path + "/no/x.json: directory " + d.path + "/no does not exist");
  EXPECT_EQ(hn::output_path_problem("--json", "/dev/null"), "--json /dev/null: exists and is not a regular file");
  EXPECT_EQ(hn::output_path_problem("--json", ""), "--json '': needs a file name");
  { std::ofstream(file) << "old"; }
  EXPECT_EQ(hn::output_path_problem("--json", file), "");  // an old regular file may be replaced
  EXPECT_EQ(hn::output_path_problem("--json", file + "/y.json"),
            "--json " + file + "/y.json: " + file + " is not a directory");
  if (::geteuid() != 0) {  // root writes anywhere
    ::chmod(d.path.c_str(), 0500);
    EXPECT_NE(hn::output_path_problem("--json", d.path + "/z.json").find("is not writable"), std::string::npos);
    ::chmod(d.path.c_str(), 0700);
  }
  EXPECT_EQ(d.entries(), 1);                                             // the write test left nothing behind
  ASSERT_EQ(::link(file.c_str(), (d.path + "/other.json").c_str()), 0);  // a second name: a run by it goes unseen
  EXPECT_EQ(hn::output_path_problem("--json", file),
            "--json " + file +
                ": the file has 2 names (hard links); a run writing it by another name would go "
                "unseen: give --json a file of one name, or remove the other names");
  ::unlink((d.path + "/other.json").c_str());
  EXPECT_EQ(hn::parent_dir("x.json"), ".");
  EXPECT_EQ(hn::parent_dir("/x.json"), "/");
}

TEST(HarnessOutput, JsonWrittenWholeOrNotAtAll) {
  TempDir d;
  const std::string file = d.path + "/r.json";
  hn::Json doc;
  doc["name"] = "a \"quoted\"\\ name\n";
  doc["nan"] = std::nan("");
  doc["x"] = 1.5;
  hn::write_json("--json", file, doc);
  EXPECT_EQ(slurp(file), "{\n \"name\": \"a \\\"quoted\\\"\\\\ name\\n\",\n \"nan\": null,\n \"x\": 1.5\n}\n");
  EXPECT_EQ(d.entries(), 1);
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  const mode_t mask = ::umask(0);
  ::umask(mask);
  EXPECT_EQ(st.st_mode & 0777, 0666 & ~mask);
  EXPECT_THROW(hn::write_json("--json", d.path + "/no/r.json", doc), std::runtime_error);
  EXPECT_THROW(hn::write_json("--json", d.path, doc), std::runtime_error);  // a directory: rename fails
  EXPECT_EQ(d.entries(), 1);                                                // no temporary left behind
  hn::remove_old_outputs(args_of({"prog"}), {{"--json", file}});
  EXPECT_EQ(d.entries(), 0);
}

TEST(HarnessOutput, SameFileHoweverSpelt) {
  TempDir d;
  const std::string f = d.path + "/r.h5", again = d.path + "/../" + hn::base_name(d.path) + "/./r.h5";
  EXPECT_TRUE(hn::same_file(f, again));  // not made yet: the same directory and name
  EXPECT_FALSE(hn::same_file(f, d.path + "/s.h5"));
  EXPECT_FALSE(hn::same_file("", ""));
  { std::ofstream(f) << "x"; }
  EXPECT_TRUE(hn::same_file(f, again));
  ASSERT_EQ(::symlink(f.c_str(), (d.path + "/link.h5").c_str()), 0);
  EXPECT_TRUE(hn::same_file(d.path + "/link.h5", f));
  EXPECT_FALSE(hn::same_file(f, d.path + "/s.h5"));
}

// A link at an output's last component is followed to the file it names, however many.
TEST(HarnessOutput, LinksFollowedToTheirFile) {
  TempDir d;
  const std::string f = d.path + "/r.h5";
  EXPECT_EQ(hn::output_target(f), f);  // nothing there yet: the path itself
  ASSERT_EQ(::symlink("r.h5", (d.path + "/a.h5").c_str()), 0);
  ASSERT_EQ(::symlink((d.path + "/a.h5").c_str(), (d.path + "/b.h5").c_str()), 0);
  EXPECT_EQ(hn::output_target(d.path + "/a.h5"), f);  // relative: from the link's directory
  EXPECT_EQ(hn::output_target(d.path + "/b.h5"), f);
  ASSERT_EQ(::symlink("loop.h5", (d.path + "/loop.h5").c_str()), 0);
  EXPECT_EQ(hn::output_target(d.path + "/loop.h5"), d.path + "/loop.h5");  // left to stat to report
}

TEST(HarnessInput, OnlyRegularFilesOfASaneSize) {
  TempDir d;
  const std::string f = d.path + "/d.toml", fifo = d.path + "/f.toml";
  EXPECT_EQ(hn::input_file_problem(f, hn::kDeckFile), "no such file");
  { std::ofstream(f) << "[run]\n"; }
  EXPECT_EQ(hn::input_file_problem(f, hn::kDeckFile), "");
  EXPECT_EQ(hn::read_input_file(f, hn::kDeckFile), "[run]\n");
  EXPECT_EQ(hn::input_file_problem(d.path, hn::kDeckFile), "is a directory; give a file");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(hn::input_file_problem(fifo, hn::kDeckFile), "is not a regular file (a FIFO); give a regular file");
  EXPECT_THROW(hn::read_input_file(fifo, hn::kDeckFile), std::runtime_error);  // refused, not blocked in open
  EXPECT_EQ(hn::input_file_problem("/dev/zero", hn::kResultsFile),
            "is not a regular file (a character device); give a regular file");
  ASSERT_EQ(::truncate(f.c_str(), off_t(hn::kDeckFile.max_bytes + (1 << 20))), 0);
  EXPECT_EQ(hn::input_file_problem(f, hn::kDeckFile),
            "is 17.0 MiB, more than a deck ever has (at most 16.0 MiB); is it the right file?");
  EXPECT_EQ(hn::input_file_problem(f, hn::kResultsFile), "");  // read in place: any size
}

// POSIX record locks belong to a process, so the second owner is a child process. (The test
// never opens the lock file while it holds the lock: closing it would drop the lock.)
TEST(HarnessLock, OneOwnerAtATime) {
  TempDir d;
  const std::string out = d.path + "/r.h5";
  hn::OutputLock lock;
  ASSERT_EQ(lock.take("prog", "--out", out), "");
  EXPECT_TRUE(lock.held());
  const pid_t child = ::fork();
  if (child == 0) {
    hn::OutputLock other;
    const std::string why = other.take("prog", "--out", out);
    const std::string holder =
        "--out " + out + ": in use by another prog run (pid " + std::to_string(::getppid()) + " on host ";
    const bool named =
        why.rfind(holder, 0) == 0 && why.find("; wait for it or choose another --out") != std::string::npos;
    ::_exit(named ? 0 : 1);
  }
  int status = -1;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the second owner was not refused as expected";
  lock.release();
  EXPECT_EQ(d.entries(), 0);  // the lock file goes with the lock
  // A lock file left by a run that died (nobody holds its lock) is simply taken over.
  { std::ofstream(out + ".lock") << "pid=1 host=gone since=2000-01-01T00:00:00Z\n"; }
  EXPECT_EQ(lock.take("prog", "--out", out), "");
  lock.release();
  EXPECT_EQ(d.entries(), 0);
  // A lock file planted as a link is refused, and what it names is left alone.
  const std::string victim = d.path + "/victim.txt";
  { std::ofstream(victim) << "keep"; }
  ASSERT_EQ(::symlink(victim.c_str(), (out + ".lock").c_str()), 0);
  EXPECT_EQ(lock.take("prog", "--out", out),
            "--out " + out + ": its lock file " + out +
                ".lock is a symbolic link; a lock file is never followed: remove the link");
  ::unlink((out + ".lock").c_str());
  ASSERT_EQ(::link(victim.c_str(), (out + ".lock").c_str()), 0);
  EXPECT_NE(lock.take("prog", "--out", out).find("lock file " + out + ".lock has 2 names"), std::string::npos);
  EXPECT_FALSE(lock.held());
  EXPECT_EQ(slurp(victim), "keep");
}

TEST(HarnessMemory, Messages) {
  EXPECT_EQ(hn::human_bytes(512), "512 B");
  EXPECT_EQ(hn::human_bytes(1536), "1.5 KiB");
  EXPECT_EQ(hn::human_bytes(1.2 * 1099511627776.0), "1.2 TiB");
  EXPECT_EQ(hn::memory_message("--seq 100000000", 1.2 * 1099511627776.0, 11.3 * 1073741824.0, 2, true),
            "--seq 100000000: needs 1.2 TiB per rank (predicted), 11.3 GiB available per rank (2 ranks on this "
            "node)");
  EXPECT_EQ(hn::memory_message("--seq 8", 2048, 1024, 1, false),
            "--seq 8: needs 2.0 KiB (predicted), 1.0 KiB available");
  EXPECT_GT(hn::node_available_bytes(), 0);
  EXPECT_NO_THROW(hn::check_memory(args_of({"prog"}), "--seq 1", 1024, 1));
  EXPECT_NE(usage_error([] { hn::check_memory(args_of({"prog"}), "--seq 1", 1e30, 1); }).find("--seq 1: needs "),
            std::string::npos);
}

TEST(HarnessMain, CheckOnRootWithoutMpi) {
  EXPECT_NO_THROW(hn::check_on_root(args_of({"prog"}), [] { return std::string(); }));
  EXPECT_EQ(usage_error([] { hn::check_on_root(args_of({"prog"}), [] { return std::string("bad"); }); }), "bad");
}
