// The decoder-layer stack (miniapp/model) on every scheme against scheme `none` on one rank,
// at the rank count this binary runs with (ctest: np 1-4). The DESIGN rule: for the output y,
// the input gradient dx and every weight gradient dW of every layer, the fp32 error of the
// scheme against fp64 `none` is within 2x the fp32 error of `none` (counted as at least 4
// fp32 ulps of the largest entry). fp64 must match fp64 `none` to 1e-10. bf16 the same way
// against bf16 `none` (at least 1 bf16 ulp), and with bf16 dK/dV accumulators and a bf16
// gradient all-reduce within that plus half an ulp per rounding they add. Decode: the tree
// scheme against `none` decoding the same tokens. At np 1 a central finite difference of the
// whole stack in fp64 checks dx and dW of `none` itself.
// Usage: minicp-test-layer --scheme=NAME [gtest flags]
#include <gtest/gtest.h>
#include <mpi.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <string>

#include "comm/comm.hpp"
#include "comm/mesh.hpp"
#include "miniapp/model/layer.hpp"
#include "tests/mpi_util.hpp"
#include "tests/reference.hpp"
#include "tests/view_util.hpp"

extern std::string g_scheme;  // from test_main.cpp (--scheme=NAME)

namespace {
using namespace minicp;
using ref::Vec;

// Every tensor a run is judged on: y and dx [N, C] in global token order of the rank's rows,
// and the weight gradients of every layer (whole, summed over the group).
struct Result {
  std::vector<int64_t> rows;
  Vec y, dx;
  std::vector<Vec> dw;
};

// 12 query heads in K/V groups of 3, so every Ulysses split at np 1-4 runs (and np 3's
// head blocks straddle the groups); S divisible by 2P for P = 1..4.
model::StackConfig small_config(model::Pass pass, const cp::Config& mask) {
  model::StackConfig c;
  c.shape = {48, 12, 4, 8, 64, 2, 10000, 1e-5};
  c.pass = pass;
  c.attn = mask;
  c.attn.seq_len = 48;
  c.attn.decode_tokens = 3;
  c.attn.attn.tile_q = c.attn.attn.tile_k = 8;
  c.seed = 7;
  return c;
}

template <class T>
Result run(const model::StackConfig& cfg, const cp::SchemeInfo& info, comm::Communicator& comm) {
  model::Stack<T> st(cfg, info, comm);
  cp::Context ctx{comm, model::attention_config(cfg)};
  st.forward(ctx);
  Result r{st.rows(), test::to_vec(st.y()), {}, {}};
  if (cfg.pass == model::Pass::Train) {
    st.backward(ctx);
    r.dx = test::to_vec(st.dx());
    for (int l = 0; l < cfg.shape.layers; ++l) r.dw.push_back(test::to_vec(st.whole_grads(l)));
  }
  return r;
}

double max_abs(const Vec& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// max |got - want| over this rank's entries / max(1e-30, max |want_full|), max over ranks.
// got holds the rows `rows` of a [*, width] tensor; want_full is the whole reference.
double err_rows(const Vec& got, const std::vector<int64_t>& rows, int64_t first_row, const Vec& want_full,
                int64_t width) {
  double e = 0;
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t c = 0; c < width; ++c)
      e = std::max(e, std::abs(got[i * width + c] - want_full[size_t((rows[i] - first_row) * width + c)]));
  e /= std::max(1e-30, max_abs(want_full));
  MPI_Allreduce(MPI_IN_PLACE, &e, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return e;
}

class LayerVsNone : public ::testing::TestWithParam<model::Pass> {};

TEST_P(LayerVsNone, OutputAndEveryGradient) {
  const model::Pass pass = GetParam();
  const cp::SchemeInfo& info = cp::find(g_scheme);
  const cp::Problem problem = pass == model::Pass::Decode ? cp::Problem::Decode : cp::Problem::Train;
  if (!info.solves(problem)) GTEST_SKIP() << g_scheme << " does not solve " << cp::to_string(problem);
  const int P = test::world_size();
  // Documents of one length, and of any lengths (S = 48: a 1-token one, one over ranks).
  for (const cp::Mask& mask :
       {cp::Mask::causal(), cp::Mask::equal_documents(20), cp::Mask::documents({7, 1, 25, 15})}) {
    SCOPED_TRACE(mask.describe());
    cp::Config m;
    m.mask = mask;
    model::StackConfig cfg = small_config(pass, m);
    cfg.attn.ranks = P;
    cfg.attn.settings["inner_ring"] = P >= 4 && P % 2 == 0 ? 2 : 0;
    const std::string why = cp::check(info, model::attention_config(cfg));
    if (!why.empty()) GTEST_SKIP() << "refused at np " << P << ": " << why;

    model::StackConfig one = cfg;  // the reference: `none` on this rank alone
    one.attn.ranks = 1;
    auto self = comm::make_mpi_comm(comm::Progress::None, 50, {}, comm::Staging::Direct, 1);
    const cp::SchemeInfo& none = cp::find("none");
    const Result ref64 = run<double>(one, none, *self), ref32 = run<float>(one, none, *self),
                 ref16 = run<kernels::bf16>(one, none, *self);

    auto world = comm::make_mpi_comm(comm::Progress::Thread);
    const Result got32 = run<float>(cfg, info, *world), got64 = run<double>(cfg, info, *world),
                 got16 = run<kernels::bf16>(cfg, info, *world);
    model::StackConfig wire = cfg;  // bf16 dK/dV ring accumulators and a bf16 gradient all-reduce
    wire.attn.bf16_dkv = wire.bf16_grad_allreduce = true;
    const Result wire16 = run<kernels::bf16>(wire, info, *world);

    const int64_t C = cfg.shape.hidden, first = cp::first_q_position(model::attention_config(cfg));
    // Below these, errors are rounding noise: 4 fp32 ulps, 1 bf16 ulp of the largest entry.
    const double floor32 = std::ldexp(1.0, -21), floor16 = std::ldexp(1.0, -8);
    const bool talk = P > 1;
    // A tensor against fp64 `none`: e[0] fp32, e[1] fp32 `none`, e[2] fp64, e[3] bf16, e[4]
    // bf16 `none`, e[5] bf16 with bf16 accumulators and all-reduce.
    auto judge = [&](const std::string& what, const double e[6]) {
      EXPECT_LE(e[0], 2.0 * std::max(e[1], floor32)) << what << ": fp32 error " << e[0] << " vs 2x none's " << e[1];
      EXPECT_LE(e[2], 1e-10) << what << ": fp64 error";
      EXPECT_LE(e[3], 2.0 * std::max(e[4], floor16)) << what << ": bf16 error " << e[3] << " vs 2x none's " << e[4];
      // Each of the P - 1 hops of a bf16 accumulator, and each of the P partial sums of a
      // bf16 all-reduce, rounds once more: half a bf16 ulp of the largest entry each.
      const double hops = talk ? P * std::ldexp(1.0, -9) : 0.0;
      EXPECT_LE(e[5], 2.0 * std::max(e[4], floor16) + hops) << what << ": bf16 accumulators, error " << e[5];
      if (test::world_rank() == 0 && std::getenv("MINICP_TEST_VERBOSE"))
        std::printf("  %s np=%d %s: f32 %.2e (none %.2e) bf16 %.2e (none %.2e) bf16-acc %.2e\n", g_scheme.c_str(), P,
                    what.c_str(), e[0], e[1], e[3], e[4], e[5]);
    };
    auto errors = [&](auto field, const auto& rows_of, int64_t row0, const Vec& want, int64_t width) {
      const Result* runs[6] = {&got32, &ref32, &got64, &got16, &ref16, &wire16};
      std::array<double, 6> e{};
      for (int i = 0; i < 6; ++i) e[size_t(i)] = err_rows(field(*runs[i]), rows_of(*runs[i]), row0, want, width);
      return e;
    };
    auto rows_of = [](const Result& r) { return r.rows; };
    judge("y", errors([](const Result& r) { return r.y; }, rows_of, first, ref64.y, C).data());
    if (pass != model::Pass::Train) continue;
    judge("dx", errors([](const Result& r) { return r.dx; }, rows_of, first, ref64.dx, C).data());
    const auto params = model::layer_params(cfg.shape);
    for (int l = 0; l < cfg.shape.layers; ++l)
      for (const model::Param& p : params) {
        auto slice = [&](const Result& r) {
          const Vec& v = r.dw[size_t(l)];
          return Vec(v.begin() + p.offset, v.begin() + p.offset + p.size());
        };
        const auto whole = [](const Result&) { return std::vector<int64_t>{0}; };
        judge("layer " + std::to_string(l) + " d" + p.name, errors(slice, whole, 0, slice(ref64), p.size()).data());
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Layer, LayerVsNone, ::testing::Values(model::Pass::Train, model::Pass::Decode),
                         [](const ::testing::TestParamInfo<model::Pass>& i) { return model::to_string(i.param); });

// The meshes of the job's ranks: tp x cp x dp = P with tp and dp in {1, 2} (not the pure CP
// group the tests above run); zigzag runs every one, the other schemes those whose TP ranks
// each hold a CP group of 2 or more (their exchanges on TP's heads), `none` those of one.
std::vector<comm::Mesh> test_meshes(int P) {
  std::vector<comm::Mesh> out;
  for (int tp = 1; tp <= 2; ++tp)
    for (int dp = 1; dp <= 2; ++dp)
      if ((tp > 1 || dp > 1) && P % (tp * dp) == 0 &&
          (g_scheme == "zigzag" || (tp > 1 && (P / (tp * dp) > 1) != (g_scheme == "none"))))
        out.emplace_back(tp, P / (tp * dp), dp);
  return out;
}

// Tensor and data parallelism: each TP rank holds its slice of every layer and the scheme runs
// on its heads (sequence parallelism on; zigzag also off, and both with the TP collectives in
// flight beside the GEMMs, run.tp_overlap); each of dp replicas runs its own sequence.
// Each rank's output and input gradient are its own sequence's from the single-rank layer
// (fp64 `none`, one rank alone, replica d's inputs), and the whole weight gradients (the TP
// slices put together) are the mean over the replicas of the single-rank gradients.
TEST(LayerMesh, MatchesTheSingleRankLayer) {
  const cp::SchemeInfo& info = cp::find(g_scheme);
  if (!info.solves(cp::Problem::Train)) GTEST_SKIP() << g_scheme << " does not train";
  const int P = test::world_size(), me = test::world_rank();
  int checked = 0;
  for (const comm::Mesh& mesh : test_meshes(P))
    for (const int variant : {0, 1, 2, 3}) {
      const bool sp = variant % 2 == 0, overlap = variant >= 2;
      // all-reduces and overlap: the layer's, not the scheme's
      if ((!sp || overlap) && (mesh.tp() == 1 || g_scheme != "zigzag")) continue;
      SCOPED_TRACE("mesh " + mesh.id() + (sp ? "" : ", all-reduces") + (overlap ? ", overlapped" : ""));
      cp::Config causal;
      causal.mask = cp::Mask::causal();
      model::StackConfig cfg = small_config(model::Pass::Train, causal);
      cfg.attn.ranks = mesh.cp(), cfg.mesh = mesh, cfg.sequence_parallel = sp, cfg.tp_overlap = overlap;
      if (!cp::check(info, model::attention_config(cfg)).empty() || !model::check_mesh(cfg, info).empty()) continue;
      auto job = comm::make_mpi_comm(comm::Progress::Thread);
      job->narrow_world(mesh.color(me, comm::Axis::CP));
      const Result got = run<double>(cfg, info, *job);

      model::StackConfig one = small_config(model::Pass::Train, causal);  // `none`, one rank, one replica
      one.attn.ranks = 1;
      auto self = comm::make_mpi_comm(comm::Progress::None, 50, {}, comm::Staging::Direct, 1);
      std::vector<Vec> mean(size_t(cfg.shape.layers));
      Result mine, first;
      for (int d = 0; d < mesh.dp(); ++d) {
        one.replica = d;
        const Result ref = run<double>(one, cp::find("none"), *self);
        if (d == mesh.coord(me, comm::Axis::DP)) mine = ref;
        if (d == 0) first = ref;
        double differ = 0;  // the replicas' sequences are not one sequence
        for (size_t i = 0; d > 0 && i < ref.y.size(); ++i) differ = std::max(differ, std::abs(ref.y[i] - first.y[i]));
        if (d > 0) {
          EXPECT_GT(differ, 1e-3 * max_abs(first.y)) << "replica " << d << " ran replica 0's sequence";
        }
        for (size_t l = 0; l < mean.size(); ++l) {
          mean[l].resize(ref.dw[l].size(), 0.0);
          for (size_t i = 0; i < mean[l].size(); ++i) mean[l][i] += ref.dw[l][i] / mesh.dp();
        }
      }
      const int64_t C = cfg.shape.hidden;
      EXPECT_LE(err_rows(got.y, got.rows, 0, mine.y, C), 1e-10) << "y against this replica's sequence";
      EXPECT_LE(err_rows(got.dx, got.rows, 0, mine.dx, C), 1e-10) << "dx against this replica's sequence";
      for (size_t l = 0; l < mean.size(); ++l) {
        ASSERT_EQ(got.dw[l].size(), mean[l].size()) << "layer " << l << ": the whole layer's gradients";
        double e = 0;
        for (size_t i = 0; i < mean[l].size(); ++i) e = std::max(e, std::abs(got.dw[l][i] - mean[l][i]));
        EXPECT_LE(e / std::max(1e-30, max_abs(mean[l])), 1e-10) << "layer " << l << " dW against the replicas' mean";
      }
      ++checked;
    }
  if (test_meshes(P).empty())
    GTEST_SKIP() << "no mesh with TP" << (g_scheme == "zigzag" ? " or DP" : "") << " at np " << P;
  EXPECT_GE(checked, 1);
}

// The bytes the TP collectives send, as the communicator counts them (comm::bytes_leaving, in
// every call's trace event), against model::tp_calls (the performance model's list) and
// against Megatron's closed form: each sequence-parallel all-gather or reduce-scatter moves
// (tp-1)/tp x N x C values, N the CP shard's tokens; an all-reduce 2 (tp-1)/tp x N x C.
TEST(LayerMesh, TpBytesAreTheClosedForm) {
  if (g_scheme != "zigzag") GTEST_SKIP() << "runs with --scheme=zigzag";
  const int P = test::world_size(), me = test::world_rank();
  if (P % 2 != 0) GTEST_SKIP() << "needs tp = 2 to divide the ranks";
  for (const int variant : {0, 1, 2, 3}) {
    const bool sp = variant % 2 == 0, overlap = variant >= 2;  // overlapped: the same bytes
    const comm::Mesh mesh(2, P / 2, 1);
    SCOPED_TRACE("mesh " + mesh.id() + (sp ? "" : ", all-reduces") + (overlap ? ", overlapped" : ""));
    cp::Config causal;
    causal.mask = cp::Mask::causal();
    model::StackConfig cfg = small_config(model::Pass::Train, causal);
    cfg.attn.ranks = mesh.cp(), cfg.mesh = mesh, cfg.sequence_parallel = sp, cfg.tp_overlap = overlap;
    auto job = comm::make_mpi_comm(comm::Progress::None);
    job->narrow_world(mesh.color(me, comm::Axis::CP));
    model::Stack<double> st(cfg, cp::find("zigzag"), *job);
    cp::Context ctx{*job, model::attention_config(cfg)};
    job->trace().set_enabled(true);
    st.forward(ctx);
    st.backward(ctx);
    int64_t traced = 0;  // the TP group's and the K/V holders' events
    for (const comm::Event& e : job->trace().events())
      if (e.kind != comm::EventKind::Wait && e.bytes > 0 && e.group != job->world().id && e.group != -1)
        traced += e.bytes;
    const int64_t N = int64_t(st.rows().size()) * (sp ? 2 : 1), L = cfg.shape.layers, C = cfg.shape.hidden;
    int64_t listed = 0;
    for (const bool bwd : {false, true})
      for (const model::TpCall& c : model::tp_calls(cfg, N, bwd, sizeof(double)))
        listed += comm::bytes_leaving(c.op, c.payload, c.group);
    EXPECT_EQ(st.tp_bytes(), L * listed);
    EXPECT_EQ(traced, st.tp_bytes()) << "the trace's events of the TP groups";
    // Megatron's closed form: 4 collectives forward and 4 backward of (tp-1)/tp x N x C values
    // each with sequence parallelism (2 all-reduces each way without), and with it the norms'
    // gradients (2 x C fp64 values all-reduced) in the backward.
    const int64_t per = N * C * int64_t(sizeof(double)) / 2;  // (tp-1)/tp = 1/2
    const int64_t want = sp ? L * (8 * per + 2 * (2 * C * int64_t(sizeof(double)) / 2)) : L * 4 * (2 * per);
    EXPECT_EQ(st.tp_bytes(), want);
  }
}

// A mesh the layer cannot run is refused before anything is allocated or split: TP that does
// not split the heads, sequence parallelism on tokens that do not divide by tp, and a mesh
// whose CP group is not the communicator's world.
TEST(LayerMesh, RefusesWhatItCannotSplit) {
  if (g_scheme != "zigzag") GTEST_SKIP() << "runs with --scheme=zigzag";
  const int P = test::world_size();
  cp::Config causal;
  causal.mask = cp::Mask::causal();
  model::StackConfig cfg = small_config(model::Pass::Train, causal);
  cfg.attn.ranks = P;
  auto job = comm::make_mpi_comm(comm::Progress::None);
  auto refusal = [&](const comm::Mesh& mesh) {
    cfg.mesh = mesh;
    try {
      model::Stack<double> st(cfg, cp::find("zigzag"), *job);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refusal(comm::Mesh(5, P, 1)).find("sweep.tp = 5: must divide model.heads (12)"), std::string::npos);
  cfg.attn.seq_len = 2 * 3 * P;  // zigzag: 6 tokens on each rank, which 4 does not divide
  EXPECT_NE(refusal(comm::Mesh(4, P, 1)).find("sequence parallelism needs every CP rank's tokens divisible by tp = 4"),
            std::string::npos);
  cfg.attn.seq_len = 48;
  if (P > 1) {
    EXPECT_NE(refusal(comm::Mesh(1, 1, P)).find("narrow_world"), std::string::npos);
  }
}

// Central differences of loss = sum(y * dy) through the whole stack (fp64, `none`, np 1):
// dx and a sample of every parameter's gradient in every layer.
TEST(LayerGradcheck, FiniteDifferencesOfTheWholeStack) {
  if (test::world_size() != 1 || g_scheme != "none") GTEST_SKIP() << "runs once: scheme none at np 1";
  cp::Config m;
  model::StackConfig cfg = small_config(model::Pass::Train, m);
  cfg.attn.seq_len = 12;
  const cp::SchemeInfo& none = cp::find("none");
  auto comm = comm::make_mpi_comm(comm::Progress::None);
  model::Stack<double> st(cfg, none, *comm);
  cp::Context ctx{*comm, model::attention_config(cfg)};
  st.forward(ctx);
  st.backward(ctx);
  const Vec dx = test::to_vec(st.dx()), dyv = test::to_vec(st.dy());
  std::vector<Vec> dw;
  for (int l = 0; l < cfg.shape.layers; ++l) dw.push_back(test::to_vec(st.grads(l)));
  auto loss = [&] {
    st.forward(ctx);
    const Vec y = test::to_vec(st.y());
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * dyv[i];
    return s;
  };
  // d loss / d buf[i] by central differences, buf a View1 or View2 over host memory.
  auto fd = [&](double* p) {
    const double h = 1e-5, keep = *p;
    *p = keep + h;
    const double up = loss();
    *p = keep - h;
    const double down = loss();
    *p = keep;
    return (up - down) / (2 * h);
  };
  auto expect_close = [](double fd_value, double analytic, const std::string& what) {
    EXPECT_NEAR(analytic, fd_value, 1e-6 * std::max(1.0, std::abs(fd_value))) << what;
  };
  const int64_t C = cfg.shape.hidden;
  for (int64_t i : {int64_t(0), int64_t(5 * C + 7), int64_t(11 * C + C - 1)})
    expect_close(fd(st.x().data() + i), dx[size_t(i)], "dx[" + std::to_string(i) + "]");
  const auto params = model::layer_params(cfg.shape);
  for (int l = 0; l < cfg.shape.layers; ++l)
    for (const model::Param& p : params)
      for (int64_t i : {int64_t(0), p.size() / 2 + 1, p.size() - 1})
        expect_close(fd(st.params(l).data() + p.offset + i), dw[size_t(l)][size_t(p.offset + i)],
                     "layer " + std::to_string(l) + " d" + p.name + "[" + std::to_string(i) + "]");
}

}  // namespace
