// Scheme lookup, common checks and the small helpers the scheme files share.
#include "miniapp/cp/scheme.hpp"

#include "harness/output.hpp"
#include "harness/watchdog.hpp"

#include <algorithm>
#include <stdexcept>

namespace minicp::cp {

void Context::at_step(int s) {
  step = s;
  harness::Watchdog::instance().step(s);
}

Mode parse_mode(const std::string& s) {
  if (s == "full") return Mode::Full;
  if (s == "compute-only") return Mode::ComputeOnly;
  if (s == "comm-only") return Mode::CommOnly;
  throw std::invalid_argument("mode '" + s + "' is not one of: full, compute-only, comm-only");
}

const char* to_string(Mode m) {
  switch (m) {
    case Mode::Full: return "full";
    case Mode::ComputeOnly: return "compute-only";
    case Mode::CommOnly: return "comm-only";
  }
  return "?";
}

const char* to_string(Problem p) { return p == Problem::Train ? "train" : "decode"; }

Config::Config() {
  for (const Setting& st : all_settings()) settings[st.name] = st.default_value;
}

int Config::setting(const std::string& name) const {
  const auto it = settings.find(name);
  if (it == settings.end()) throw std::logic_error("no scheme registers a setting named '" + name + "'");
  return it->second;
}

const SchemeInfo& find(const std::string& name) {
  std::string names;
  for (const auto& s : registry()) {
    if (s.name == name) return s;
    names += (names.empty() ? "" : ", ") + s.name;
  }
  throw std::invalid_argument("scheme '" + name + "' is not one of: " + names);
}

std::string registry_json(int indent) {
  using harness::Json;
  Json all = Json::array();
  for (const SchemeInfo& info : registry()) {
    Json problems = Json::array(), settings = Json::array();
    for (Problem pr : info.problems) problems.push_back(to_string(pr));
    for (const Setting& st : info.settings)
      settings.push_back({{"name", st.name}, {"help", st.help}, {"default", st.default_value}, {"min", st.min_value}});
    all.push_back({{"name", info.name},
                   {"summary", info.summary},
                   {"problems", problems},
                   {"ring_family", info.ring_family},
                   {"takes_dispatch", info.takes_dispatch},
                   {"refuses", info.refuses},
                   {"settings", settings}});
  }
  return all.dump(indent);
}

std::vector<Setting> all_settings() {
  std::vector<Setting> out;
  for (const auto& s : registry())
    for (const Setting& st : s.settings)
      if (std::none_of(out.begin(), out.end(), [&](const Setting& o) { return o.name == st.name; })) out.push_back(st);
  return out;
}

std::string check(const SchemeInfo& s, const Config& c) {
  auto num = [](auto v) { return std::to_string(v); };
  if (c.seq_len < 1) return "seq_len (" + num(c.seq_len) + ") must be >= 1";
  if (c.heads < 1 || c.kv_heads < 1) return "heads and kv_heads must be >= 1";
  if (c.head_dim < 2 || c.head_dim % 2) return "head_dim (" + num(c.head_dim) + ") must be even and >= 2";
  if (c.heads % c.kv_heads)
    return "heads (" + num(c.heads) + ") must be a multiple of kv_heads (" + num(c.kv_heads) + ")";
  if (c.ranks < 1) return "ranks must be >= 1";
  if (c.problem == Problem::Decode && c.decode_tokens < 1)
    return "decode_tokens (" + num(c.decode_tokens) + ") must be >= 1";
  if (!s.solves(c.problem)) {
    std::string can;
    for (Problem p : s.problems) can += std::string(can.empty() ? "" : ", ") + to_string(p);
    return s.name + " does not solve the " + to_string(c.problem) + " problem (it solves: " + can + ")";
  }
  for (const Setting& st : s.settings)
    if (c.setting(st.name) < st.min_value)
      return s.name + " needs " + st.name + " (" + num(c.setting(st.name)) + ") >= " + num(st.min_value);
  return s.check(c);
}

int64_t global_q_tokens(const Config& cfg) { return cfg.problem == Problem::Decode ? cfg.decode_tokens : cfg.seq_len; }

int64_t first_q_position(const Config& cfg) { return cfg.problem == Problem::Decode ? cfg.seq_len : 0; }

std::vector<int64_t> decode_positions(const Config& cfg) {
  std::vector<int64_t> pos(size_t(cfg.decode_tokens));
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = cfg.seq_len + int64_t(i);
  return pos;
}

int64_t predicted_bytes(const SchemeInfo& s, const Config& cfg, size_t elem) {
  // Every layout holds ceil(S/P) rows at most on a rank; decode queries sit on every rank.
  // Counted, not built: a shard list of a huge S would itself not fit.
  const int64_t skv = cfg.seq_len / cfg.ranks + (cfg.seq_len % cfg.ranks != 0 ? 1 : 0);  // no overflow near 2^63
  const int64_t sq = cfg.problem == Problem::Decode ? cfg.decode_tokens : skv;
  // In double: a seq_len near 2^63 must give "too much", not wrap around.
  const double q = double(sq) * cfg.heads * cfg.head_dim, kv = double(skv) * cfg.kv_heads * cfg.head_dim;
  const int copies = cfg.problem == Problem::Train ? 2 : 1;  // the backward's dq, dout / dk, dv beside q, o / k, v
  // lse [Sq,H], and in the backward the kernel's row term (dout . o) [Sq,H] during the call.
  const double acc = double(kernels::acc_size(elem)) / double(elem);
  const double tensors = 2.0 * copies * (q + kv) + acc * copies * double(sq) * cfg.heads;
  const Workspace w = s.workspace ? s.workspace(cfg) : Workspace{};
  return bytes_of(tensors + w.values(elem, 1), elem);
}

Kokkos::View<int64_t*, kernels::Mem> to_device(const std::vector<int64_t>& v, const char* label) {
  Kokkos::View<int64_t*, kernels::Mem> d(std::string(label), v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (size_t i = 0; i < v.size(); ++i) h(i) = v[i];
  Kokkos::deep_copy(d, h);
  return d;
}

namespace {
// The kernels' per-token document ids of positions pos (int32: a kernel compares ids alone).
Kokkos::View<int32_t*, kernels::Mem> docs_of(const std::vector<int64_t>& pos, const Mask& mask, const char* label) {
  Kokkos::View<int32_t*, kernels::Mem> d(std::string(label), pos.size());
  auto h = Kokkos::create_mirror_view(d);
  for (size_t i = 0; i < pos.size(); ++i) h(i) = int32_t(mask.doc_of(pos[i]));
  Kokkos::deep_copy(d, h);
  return d;
}
}  // namespace

kernels::AttnMask make_mask(const Config& cfg, const std::vector<int64_t>& qpos, const std::vector<int64_t>& kpos) {
  kernels::AttnMask m;
  m.q_pos = to_device(qpos, "q_pos");
  m.k_pos = to_device(kpos, "k_pos");
  if (cfg.mask.has_documents()) {
    m.q_doc = docs_of(qpos, cfg.mask, "q_doc");
    m.k_doc = docs_of(kpos, cfg.mask, "k_doc");
  }
  m.causal = cfg.mask.is_causal();
  m.window = cfg.mask.window();
  return m;
}

bool fully_masked(const Config& cfg, const std::vector<int64_t>& qpos, const std::vector<int64_t>& kpos) {
  if (qpos.empty() || kpos.empty()) return true;
  const auto [qmin, qmax] = std::minmax_element(qpos.begin(), qpos.end());
  const auto [kmin, kmax] = std::minmax_element(kpos.begin(), kpos.end());
  return cfg.mask.fully_masked(*qmin, *qmax, *kmin, *kmax);
}

}  // namespace minicp::cp
