// Shared scheme helpers (see common.hpp).
#include "miniapp/cp/common.hpp"

#include <mutex>

#include "miniapp/cp/layout.hpp"

namespace minicp::cp {

namespace {
std::vector<std::function<void()>>& scratch_caches() {
  static std::vector<std::function<void()>> clears;
  return clears;
}
}  // namespace

void detail::register_scratch_cache(std::function<void()> clear) { scratch_caches().push_back(std::move(clear)); }

void release_scratch() {
  for (const auto& clear : scratch_caches()) clear();
}

std::shared_ptr<const std::vector<predict::Spans>> dispatch_spans(
    const std::shared_ptr<const std::vector<std::vector<int64_t>>>& tokens) {
  static std::mutex mu;
  static std::shared_ptr<const std::vector<std::vector<int64_t>>> key;  // held: its address stays its own
  static std::shared_ptr<const std::vector<predict::Spans>> value;
  std::lock_guard<std::mutex> lock(mu);
  if (key != tokens) {
    auto spans = std::make_shared<std::vector<predict::Spans>>();
    for (const auto& t : *tokens) spans->push_back(layout::spans_of_positions(t));
    key = tokens, value = spans;
  }
  return value;
}

std::vector<std::vector<int64_t>> allgather_positions(Context& ctx, const comm::Group& g,
                                                      const std::vector<int64_t>& mine) {
  const auto& known = ctx.cfg.tokens;
  if (known && int(known->size()) == g.size && (*known)[size_t(g.rank)] == mine) return *known;
  auto& cache = ctx.gathered_positions;
  const auto key = std::make_pair(g.id, mine);
  if (!communicates(ctx) && cache.count(key)) return cache.at(key);
  std::vector<int64_t> all(mine.size() * g.size);
  comm::Request r = ctx.comm.iallgather(mine.data(), all.data(), mine.size() * sizeof(int64_t), g);
  ctx.comm.wait(r);
  std::vector<std::vector<int64_t>> out(g.size);
  for (int i = 0; i < g.size; ++i) out[i].assign(all.begin() + i * mine.size(), all.begin() + (i + 1) * mine.size());
  cache[key] = out;
  return out;
}

bool all_agree(Context& ctx, const comm::Group& g, bool mine) {
  if (g.size == 1) return mine;
  int64_t missing = mine ? 0 : 1;
  const double t0 = MPI_Wtime();
  ctx.comm.allreduce(&missing, 1, comm::DType::I64, comm::ReduceOp::Max, g, ctx.step);
  ctx.stats.comm_wait_s += MPI_Wtime() - t0;
  return missing == 0;
}

}  // namespace minicp::cp
