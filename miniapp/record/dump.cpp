// The --dump file (see dump.hpp), written through record::H5File.
#include "miniapp/record/dump.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "comm/mpi_group.hpp"
#include "kernels/convert.hpp"
#include "miniapp/record/h5.hpp"

namespace minicp::record {

namespace {

// A host copy of a view (the view itself when it already lives on the host).
// bf16 values are widened to fp32 (exactly: every bf16 is an fp32), which HDF5 and h5py read
// natively; the file's `dtype` attribute says they were bf16.
template <class V>
auto on_host(const V& v) {
  if constexpr (std::is_same<typename V::non_const_value_type, kernels::bf16>::value) {
    Kokkos::View<float*, kernels::Mem> wide(Kokkos::view_alloc(std::string("dump_wide"), Kokkos::WithoutInitializing),
                                            v.span());
    kernels::convert<float, kernels::bf16>(wide.data(), v.data(), int64_t(v.span()));
    return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), wide);
  } else {
    return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  }
}

constexpr const char* kRopeConvention =
    "rotate-half, angle = position * rope_theta^(-2i/head_dim), i < head_dim/2, positions 0..S-1 "
    "(decode: the new tokens at S..S+T-1)";

// /mask/keys [Nq, 2]: the first and last key position each query row sees (queries at
// positions q0.., keys up to q0 + Nq - 1), from the mask itself: the checker reads these and
// knows no mask rule.
void write_mask(H5File& f, const cp::Config& a, int64_t Nq, int64_t q0) {
  std::vector<int64_t> keys(size_t(2 * Nq));
  for (int64_t i = 0; i < Nq; ++i) {
    const auto [lo, hi] = a.mask.keys_of(q0 + i);
    keys[size_t(2 * i)] = lo;
    keys[size_t(2 * i + 1)] = std::min(hi, q0 + Nq - 1);
  }
  f.write_replicated("/mask/keys", Nq, 2, keys.data());
}

}  // namespace

std::string not_a_dump_file(const std::string& path) { return kind_mismatch(path, kDumpKind); }

MPI_Comm mpi_job(const comm::Communicator& comm) { return comm::mpi_of(comm.job()); }

namespace {

// The root attributes every dump has (docs/results-file.md, "--dump FILE.h5").
void write_root_attrs(H5File& f, const model::StackConfig& cfg, const std::string& scheme, int cp_ranks,
                      const std::string& dtype) {
  const model::Shape& m = cfg.shape;
  const cp::Config& a = cfg.attn;
  const int64_t S = a.seq_len;
  f.set_attr("/", "file_kind", kDumpKind);
  f.set_attr("/", "rope_theta", m.rope_theta);
  f.set_attr("/", "norm_eps", m.norm_eps);
  f.set_attr("/", "heads", m.heads);
  f.set_attr("/", "kv_heads", m.kv_heads);
  f.set_attr("/", "head_dim", m.head_dim);
  f.set_attr("/", "layers", m.layers);
  f.set_attr("/", "hidden", m.hidden);
  f.set_attr("/", "ffn", m.ffn);
  f.set_attr("/", "seq_len", S);
  f.set_attr("/", "mask", a.mask.name());
  f.set_attr("/", "mask_description", a.mask.describe());
  f.set_attr("/", "softmax_scale", a.attn.scale > 0 ? a.attn.scale : 1.0 / std::sqrt(double(m.head_dim)));
  f.set_attr("/", "scheme", scheme);
  f.set_attr("/", "ranks", cp_ranks);
  f.set_attr("/", "tp", cfg.mesh.tp());
  f.set_attr("/", "dp", cfg.mesh.dp());
  f.set_attr("/", "dtype", dtype);
  f.set_attr("/", "pass", model::to_string(cfg.pass));
  f.set_attr("/", "rope_convention", kRopeConvention);
}

}  // namespace

template <class T>
void write_dump(const std::string& path, const model::Stack<T>& st, const model::StackConfig& cfg,
                const std::string& scheme, comm::Communicator& comm) {
  const model::Shape& m = cfg.shape;
  const cp::Config& a = cfg.attn;
  const bool train = cfg.pass == model::Pass::Train, decode = cfg.pass == model::Pass::Decode;
  const int64_t C = m.hidden, S = a.seq_len, T_ = decode ? a.decode_tokens : 0;
  const auto& rows = st.rows();
  if (int64_t(st.x().extent(0)) != int64_t(rows.size()) || int64_t(st.x().extent(1)) != C)
    throw std::logic_error("write_dump '" + path + "': the stack does not match the config");
  if (train && st.dx().extent(0) != rows.size())
    throw std::logic_error("write_dump '" + path + "': a train dump needs the stack's backward() first");

  H5File f(path, mpi_job(comm));
  write_root_attrs(f, cfg, scheme, comm.world().size, kernels::dtype_name<T>());
  if (decode) f.set_attr("/", "decode_tokens", T_);

  // Activations: each rank its own rows, at their global token index, DP replica d's
  // sequence at rows d*S.. (decode: the T new tokens, the same on every rank of a replica).
  const int dp = cfg.mesh.dp(), replica = dp > 1 ? cfg.mesh.coord(comm.job().rank, comm::Axis::DP) : 0;
  // Without sequence parallelism the TP ranks of a CP rank hold the same rows: one writes them.
  std::vector<int64_t> at = st.owns_rows() ? rows : std::vector<int64_t>();  // each row's place in the file
  for (int64_t& r : at) r += replica * (decode ? T_ : S);
  std::vector<int64_t> new_tokens(static_cast<size_t>(T_));  // decode: the T new tokens' places
  for (int64_t t = 0; t < T_; ++t) new_tokens[size_t(t)] = replica * T_ + t;
  const bool one_writer = comm.world().rank == 0 && st.owns_rows();  // of a replica's decode rows (all hold them)
  auto activation = [&](const char* name, const kernels::View2<T>& v) {
    const auto h = on_host(v);
    const std::string dset = std::string("/tensors/") + name;
    if (decode)
      f.write_rows(dset, dp * T_, C, one_writer ? new_tokens : std::vector<int64_t>(), h.data());
    else
      f.write_rows(dset, dp * S, C, at, h.data());
  };
  write_mask(f, a, decode ? T_ : S, decode ? S : 0);
  activation("x", st.x());
  activation("y", st.y());
  if (train) {
    activation("dy", st.dy());
    activation("dx", st.dx());
  }

  // Per layer: the parameters (replicated), their gradients, the decode cache.
  const auto params = model::layer_params(m);
  const int64_t KD = int64_t(m.kv_heads) * m.head_dim;
  for (int l = 0; l < m.layers; ++l) {
    const std::string dir = "/tensors/layers/" + std::to_string(l) + "/";
    const auto w = on_host(st.whole_params(l));
    for (const model::Param& p : params) f.write_replicated(dir + p.name, p.rows, p.cols, w.data() + p.offset);
    if (train) {
      const auto dw = on_host(st.whole_grads(l));
      for (const model::Param& p : params) f.write_replicated(dir + "d" + p.name, p.rows, p.cols, dw.data() + p.offset);
    }
    if (decode) {
      const auto k = on_host(st.whole_cache_k(l)), v = on_host(st.whole_cache_v(l));
      std::vector<int64_t> cache_at =
          st.owns_rows() ? st.cache_rows() : std::vector<int64_t>();  // replica d's at d*S..
      for (int64_t& r : cache_at) r += replica * S;
      f.write_rows(dir + "cache_k", dp * S, KD, cache_at, k.data());
      f.write_rows(dir + "cache_v", dp * S, KD, cache_at, v.data());
    }
  }
  f.commit();
}

template void write_dump<float>(const std::string&, const model::Stack<float>&, const model::StackConfig&,
                                const std::string&, comm::Communicator&);
template void write_dump<double>(const std::string&, const model::Stack<double>&, const model::StackConfig&,
                                 const std::string&, comm::Communicator&);
template void write_dump<kernels::bf16>(const std::string&, const model::Stack<kernels::bf16>&,
                                        const model::StackConfig&, const std::string&, comm::Communicator&);

}  // namespace minicp::record
