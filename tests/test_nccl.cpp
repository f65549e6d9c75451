// NCCL backend on device buffers: ring exchange, all-gather, reduce-scatter, all-reduce and
// all-to-all checked on the data. Prints "skipped: no GPU" (ctest shows it skipped) when no
// CUDA device is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "comm/comm.hpp"

namespace {
using namespace minicp;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct Dev {
  float* p = nullptr;
  size_t n = 0;
  explicit Dev(const std::vector<float>& h) : n(h.size()) {
    cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(float));
    cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  }
  explicit Dev(size_t count) : n(count) { cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(float)); }
  ~Dev() { cudaFree(p); }
  std::vector<float> host() const {
    std::vector<float> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost);
    return h;
  }
};

TEST(Nccl, CollectivesOnDeviceBuffers) {
  if (!have_gpu()) {
    std::printf("skipped: no GPU (no CUDA device visible)\n");
    GTEST_SKIP() << "skipped: no GPU";
  }
  auto comm = comm::make_nccl_comm();
  const auto& w = comm->world();
  const int P = w.size, r = w.rank;
  const size_t n = 1 << 16;
  // Ring exchange: receive the previous rank's stamp.
  Dev send(std::vector<float>(n, float(r))), recv(n);
  auto q = comm->isendrecv(send.p, n * 4, (r + 1) % P, recv.p, n * 4, (r - 1 + P) % P, w);
  comm->wait(q);
  for (float x : recv.host()) ASSERT_EQ(x, float((r - 1 + P) % P));
  // All-gather.
  Dev gathered(n * P);
  q = comm->iallgather(send.p, gathered.p, n * 4, w);
  comm->wait(q);
  const auto g = gathered.host();
  for (int i = 0; i < P; ++i) ASSERT_EQ(g[size_t(i) * n], float(i));
  // Reduce-scatter of ones: every entry is P.
  Dev ones(std::vector<float>(n * P, 1.0f)), part(n);
  q = comm->ireduce_scatter(ones.p, part.p, n, comm::DType::F32, w);
  comm->wait(q);
  for (float x : part.host()) ASSERT_EQ(x, float(P));
  // All-reduce max of the rank.
  Dev m(std::vector<float>(4, float(r)));
  comm->allreduce(m.p, 4, comm::DType::F32, comm::ReduceOp::Max, w);
  for (float x : m.host()) ASSERT_EQ(x, float(P - 1));
  // All-to-all: block i of rank r is r*P + i.
  std::vector<float> a2a(P * 8);
  for (int i = 0; i < P; ++i)
    for (int j = 0; j < 8; ++j) a2a[i * 8 + j] = float(r * P + i);
  Dev s2(a2a), r2(a2a.size());
  comm->alltoall(s2.p, r2.p, 8 * 4, w);
  const auto got = r2.host();
  for (int i = 0; i < P; ++i) ASSERT_EQ(got[i * 8], float(i * P + r));
  EXPECT_GE(comm->trace().events().size(), 5u);
}

}  // namespace
