// minicp-h5-bench: the cost of writing a case of the results file (record::Results) with
// --events events per rank, on as many ranks as mpirun starts: one transaction (copy the
// file, add the case's tables collectively, rename), as minicp does after every case.
// Prints the seconds and a MINICP_H5 line.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "harness/cli.hpp"
#include "harness/main.hpp"
#include "harness/output.hpp"
#include "miniapp/record/results.hpp"

namespace {
using namespace minicp;
namespace hn = minicp::harness;

struct Options {
  int64_t events = 500000;  // per rank
  int64_t reps = 3;
  std::string out = "h5_bench.h5";
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  return hn::main(
      argc, argv, "minicp-h5-bench",
      [&](const hn::Args& a) {
        CLI::App app{"minicp-h5-bench: time to write one results-file case with N events per rank"};
        hn::add_int(app, "--events", o.events, 0, int64_t(1) << 32, "events per rank");
        hn::add_int(app, "--reps", o.reps, 1, 1000, "cases written (the median is reported)");
        app.add_option("--out", o.out, "the HDF5 file written (removed at the end)")->capture_default_str();
        hn::parse(app, a);
        hn::check_outputs(a, {{"--out", o.out}});
      },
      [&](const hn::Args& a) {
        record::Attrs root;
        root.text["deck"] = "bench";
        record::Results res(o.out, MPI_COMM_WORLD, root, "", "bench");
        std::vector<double> secs;
        for (int64_t r = 0; r < o.reps; ++r) {
          record::CaseRecord c;
          c.id = "case" + std::to_string(r);
          c.attrs.text["status"] = "ok";
          c.events.resize(size_t(o.events));
          for (int64_t i = 0; i < o.events; ++i)
            c.events[size_t(i)] = {a.rank(), 0,   0,        int32_t(i % 80), 0, int32_t(i % 8), 0, -1, 0, -1,
                                   i,        1e6, 1e-6 * i, 1e-6 * i + 5e-7};
          c.memory.push_back({a.rank(), 1, 1, 1});
          secs.push_back(res.add_case(c));
        }
        std::sort(secs.begin(), secs.end());
        const double med = secs[secs.size() / 2];
        if (a.rank() == 0)
          std::printf(
              "MINICP_H5 ranks=%d events_per_rank=%lld events=%lld write_s=%.3f (median of %lld; the file "
              "grows with each case)\n",
              a.size(), (long long)o.events, (long long)(o.events * a.size()), med, (long long)o.reps);
        if (a.rank() == 0) std::remove(o.out.c_str());
        return 0;
      });
}
