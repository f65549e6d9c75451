// The deck keys: one row per key (deck.hpp, DeckKey). A new key is one row here (and its
// member in Deck); load_deck, --help, the resolved deck and the case attributes follow.
#include "miniapp/run/deck.hpp"

#include "miniapp/cp/dispatch.hpp"

#include <algorithm>
#include <sstream>
#include <type_traits>

namespace minicp::run {
namespace {

std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// A KeyValue into the member a key fills (an integer of any width, a double, a string, a
// list of strings, a list of integers of any width), and back.
template <class T>
T from_value(const KeyValue& v) {
  if constexpr (std::is_integral_v<T>) {
    return T(std::get<int64_t>(v));
  } else if constexpr (std::is_same_v<T, double> || std::is_same_v<T, std::string> ||
                       std::is_same_v<T, std::vector<std::string>>) {
    return std::get<T>(v);
  } else {
    const auto& l = std::get<std::vector<int64_t>>(v);
    return T(l.begin(), l.end());
  }
}
template <class T>
KeyValue to_value(const T& x) {
  if constexpr (std::is_integral_v<T>) {
    return int64_t(x);
  } else if constexpr (std::is_same_v<T, double> || std::is_same_v<T, std::string> ||
                       std::is_same_v<T, std::vector<std::string>>) {
    return x;
  } else {
    return std::vector<int64_t>(x.begin(), x.end());
  }
}

// A row of the table being written: made by its kind (integer(), one_of(), ...), then told
// where its value goes (to, to_shape, to_enums, or a setter and a getter) and its options.
struct Row {
  DeckKey k;
  Row& def(std::string toml, std::string meaning = "") {
    k.default_toml = std::move(toml);
    return meaning.empty() ? *this : note(std::move(meaning));
  }
  Row& note(std::string n) {
    k.default_note = std::move(n);
    return *this;
  }
  Row& attr() {
    k.case_attr = true;
    return *this;
  }
  Row& in_resolved(InResolved r) {
    k.resolved = r;
    return *this;
  }
  Row& to(std::function<void(Deck&, const KeyValue&)> set, std::function<KeyValue(const Deck&)> get) {
    k.set = std::move(set), k.get = std::move(get);
    return *this;
  }
  template <class T>
  Row& to(T Deck::*m) {
    return to([m](Deck& d, const KeyValue& v) { d.*m = from_value<T>(v); },
              [m](const Deck& d) { return to_value(d.*m); });
  }
  template <class T>
  Row& to_shape(T model::Shape::*m) {
    return to([m](Deck& d, const KeyValue& v) { d.shape.*m = from_value<T>(v); },
              [m](const Deck& d) { return to_value(d.shape.*m); });
  }
  // A list of enum values read by name: the names of `all` are the choices.
  template <class E>
  Row& to_enums(std::vector<E> Deck::*m, std::vector<E> all, const char* (*name)(E)) {
    for (E e : all) k.choices.push_back(name(e));
    auto set = [m, all, name](Deck& d, const KeyValue& v) {
      (d.*m).clear();
      for (const std::string& s : std::get<std::vector<std::string>>(v))
        (d.*m).push_back(*std::find_if(all.begin(), all.end(), [&](E e) { return s == name(e); }));
    };
    auto get = [m, name](const Deck& d) {
      std::vector<std::string> names;
      for (E e : d.*m) names.push_back(name(e));
      return KeyValue(names);
    };
    return to(set, get);
  }
};

Row key(const std::string& section, const std::string& name, KeyType type, const std::string& help) {
  Row r;
  r.k.section = section, r.k.name = name, r.k.type = type, r.k.help = help;
  return r;
}
Row integer(const std::string& s, const std::string& n, int64_t lo, int64_t hi, const std::string& help) {
  Row r = key(s, n, KeyType::Integer, help);
  r.k.min = lo, r.k.max = hi;
  return r;
}
Row integers(const std::string& s, const std::string& n, int64_t lo, int64_t hi, const std::string& help) {
  Row r = integer(s, n, lo, hi, help);
  r.k.type = KeyType::Integers;
  return r;
}
Row number(const std::string& s, const std::string& n, double above, const std::string& help) {
  Row r = key(s, n, KeyType::Number, help);
  r.k.above = above;
  return r;
}
Row one_of(const std::string& s, const std::string& n, std::vector<std::string> choices, const std::string& help) {
  Row r = key(s, n, KeyType::Choice, help);
  r.k.choices = std::move(choices);
  return r;
}
Row list_of(const std::string& s, const std::string& n, std::vector<std::string> choices, const std::string& help) {
  Row r = one_of(s, n, std::move(choices), help);
  r.k.type = KeyType::Choices;
  return r;
}
Row text(const std::string& s, const std::string& n, const std::string& help) { return key(s, n, KeyType::Text, help); }

std::vector<std::string> dispatch_names() {
  std::vector<std::string> n = {"layout"};
  for (const std::string& d : cp::Dispatch::names()) n.push_back(d);
  return n;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const model::Preset& p : model::presets()) names.push_back(p.name);
  return names;
}

// [model]. The preset comes first: its setter fills the whole shape, which the keys after
// it then override one by one.
std::vector<Row> model_rows() {
  auto preset = [](Deck& d, const KeyValue& v) {
    d.preset = std::get<std::string>(v);
    d.shape = *model::find_preset(d.preset);
  };
  const std::string by_preset = "the preset's";
  auto dim = [&](const char* name, int64_t lo, int64_t hi, int model::Shape::*m, const char* help) {
    return integer("model", name, lo, hi, help).note(by_preset).to_shape(m).attr();
  };
  const model::Shape plain;  // rope_theta and norm_eps without a preset
  return {
      one_of("model", "preset", preset_names(), "a model shape: fills the keys below (explicit keys override it)")
          .note("none")
          .in_resolved(InResolved::WhenSet)
          .to(preset, [](const Deck& d) { return KeyValue(d.preset); }),
      dim("hidden", 1, 1 << 20, &model::Shape::hidden, "model width C"),
      dim("heads", 1, 1 << 12, &model::Shape::heads, "query heads H"),
      dim("kv_heads", 1, 1 << 12, &model::Shape::kv_heads, "key/value heads (divides heads; fewer than heads: GQA)"),
      dim("head_dim", 2, 1 << 12, &model::Shape::head_dim, "dimension D of a head (even)"),
      dim("ffn", 1, 1 << 22, &model::Shape::ffn, "the MLP's inner width F"),
      dim("layers", 1, 1 << 12, &model::Shape::layers, "decoder layers L"),
      number("model", "rope_theta", 1, "RoPE base")
          .note(by_preset + "; " + number_text(plain.rope_theta) + " without one")
          .to_shape(&model::Shape::rope_theta)
          .attr(),
      number("model", "norm_eps", 0, "RMSNorm epsilon")
          .note(by_preset + "; " + number_text(plain.norm_eps) + " without one")
          .to_shape(&model::Shape::norm_eps)
          .attr(),
  };
}

std::vector<Row> run_rows() {
  using cp::Mode;
  using model::Pass;
  return {
      list_of("run", "pass", {}, "train: forward and backward; prefill: forward; decode: new tokens against a KV cache")
          .def("[\"train\"]")
          .to_enums(&Deck::passes, {Pass::Train, Pass::Prefill, Pass::Decode}, model::to_string),
      one_of("run", "mask", cp::Mask::kind_names(), "the attention mask").def("\"causal\"").to(&Deck::mask),
      integer("run", "window", 0, INT64_MAX, "sliding window in tokens, with mask = \"window\" only")
          .def("0", "none")
          .to(&Deck::window)
          .attr(),
      integer("run", "doc_len", 0, INT64_MAX, "packed documents of doc_len tokens, with mask = \"documents\" only")
          .def("0", "one document")
          .to(&Deck::doc_len)
          .attr(),
      one_of("run", "dtype", {"f32", "f64", "bf16"},
             "precision of the stored tensors (bf16: weights, activations, Q/K/V/O, activation gradients and CP "
             "messages in bf16; GEMMs, softmax statistics, LSE, merges and weight gradients in fp32)")
          .def("\"f32\"")
          .to(&Deck::dtype)
          .attr(),
      one_of("run", "dkv_accumulator", {"f32", "bf16"},
             "bf16 runs: the type of the dK/dV accumulators that travel with a ring backward (bf16: rounded at "
             "every hop, half the bytes)")
          .def("\"f32\"")
          .to(&Deck::dkv_accumulator)
          .attr(),
      one_of("run", "grad_allreduce", {"f32", "bf16"},
             "bf16 runs: the type the weight gradients are summed over the CP group in (bf16: half the bytes)")
          .def("\"f32\"")
          .to(&Deck::grad_allreduce)
          .attr(),
      integer("run", "warmup", 0, 1000000, "untimed repetitions of each case").def("1").to(&Deck::warmup).attr(),
      integer("run", "reps", 1, 1000000, "timed repetitions of each case (per round)").def("3").to(&Deck::reps).attr(),
      integer("run", "rounds", 1, 1000,
              "passes over the cases, each running every case's warm-up and reps in turn: a slow spell of the "
              "machine then falls on one round of every case, not on all reps of one (a case holds rounds x reps reps)")
          .def("1")
          .to(&Deck::rounds)
          .attr(),
      list_of("run", "modes", {}, "full: compute and communicate; compute-only, comm-only: the other skipped")
          .def("[\"full\"]")
          .to_enums(&Deck::modes, {Mode::Full, Mode::ComputeOnly, Mode::CommOnly}, cp::to_string),
      integer("run", "seed", 0, INT64_MAX, "the generator's seed").def("1").to(&Deck::seed),
      integer("run", "dispatch_chunk", 1, INT32_MAX, "the area dispatch's chunk: tokens handed out together")
          .def("128")
          .to(&Deck::dispatch_chunk)
          .attr(),
      one_of("run", "progress", {"thread", "none"}, "communication progress: a thread per rank, or none")
          .def("\"thread\"")
          .to(&Deck::progress),
      integer("run", "stall_timeout_s", 0, 1000000,
              "seconds a rank may make no progress before the stall watchdog ends the job (0: off)")
          .def("600")
          .in_resolved(InResolved::Never)
          .to(&Deck::stall_timeout_s),
      text("run", "fabric",
           "fabric profile: a name from inputs/fabrics/ or a path to a profile TOML (--fabric overrides)")
          .def("\"\"", "no profile: MPI's own defaults")
          .in_resolved(InResolved::WhenSet)
          .to(&Deck::fabric),
      text("run", "calibration",
           "the performance model's table for the predicted_* figures of each case: a file written by minicp "
           "--calibrate, \"measure\" (measured at start-up on this job: the deck's shapes, every rank at once), or "
           "\"\" (no prediction: NaN) (--calibration FILE overrides)")
          .def("\"\"", "no prediction")
          .in_resolved(InResolved::Never)
          .to(&Deck::calibration),
  };
}

// [run]'s keys of the mesh (sweep.tp, sweep.ranks and sweep.dp give its sizes).
std::vector<Row> mesh_rows() {
  return {one_of("run", "rank_order", comm::Mesh::orders(),
                 "the mesh's axes, innermost first: which ranks form a TP, CP and DP group (tp-cp-dp: a CP group's "
                 "ranks stride over TP's, a DP group's over both, as Megatron orders them)")
              .def("\"tp-cp-dp\"")
              .to(&Deck::rank_order),
          one_of("run", "sequence_parallel", {"on", "off"},
                 "with sweep.tp > 1: Megatron's sequence parallelism (norms on 1/tp of the CP shard's tokens, "
                 "all-gathers and reduce-scatters around the TP GEMMs) or all-reduces (off; decode is always off)")
              .def("\"on\"")
              .to(&Deck::sequence_parallel),
          one_of("run", "tp_overlap", {"on", "off"},
                 "with sweep.tp > 1: TP's collectives in flight beside the GEMMs that do not need them (an "
                 "all-gather beside the GEMMs on the rank's own rows, a backward reduce beside the weight-gradient "
                 "GEMMs) or each waited for at once (off)")
              .def("\"off\"")
              .to(&Deck::tp_overlap)};
}

// [sweep], the registry's scheme settings last. sweep.schemes keeps the names as written
// ("all" is expanded after the table, see expand_schemes), so the resolved deck says "all".
std::vector<Row> sweep_rows() {
  std::vector<std::string> schemes = {"all"};
  for (const cp::SchemeInfo& s : cp::registry()) schemes.push_back(s.name);
  auto set_schemes = [](Deck& d, const KeyValue& v) {
    d.schemes = std::get<std::vector<std::string>>(v);
    d.all_schemes = std::find(d.schemes.begin(), d.schemes.end(), "all") != d.schemes.end();
  };
  auto get_schemes = [](const Deck& d) {
    return KeyValue(d.all_schemes ? std::vector<std::string>{"all"} : d.schemes);
  };
  std::vector<Row> rows = {
      list_of("sweep", "schemes", schemes, "the schemes; \"all\" (alone): every scheme that solves a pass")
          .def("[\"all\"]")
          .to(set_schemes, get_schemes),
      integers("sweep", "seq_len", 1, INT64_MAX / 2, "global tokens S (decode: the KV-cache length)")
          .note("none, required")
          .to(&Deck::seq_len),
      integers("sweep", "ranks", 1, INT32_MAX, "CP group sizes, each <= the MPI job's ranks (the others wait)")
          .note("the MPI job's size")
          .to(&Deck::ranks),
      integers("sweep", "tp", 1, INT32_MAX,
               "tensor-parallel degrees: each TP rank holds 1/tp of every layer's heads and FFN columns (Megatron's "
               "layout), the CP scheme runs on its heads; tp x ranks x dp <= the MPI job's ranks")
          .def("[1]")
          .to(&Deck::tp),
      integers("sweep", "dp", 1, INT32_MAX,
               "data-parallel degrees: replicas of the CP group, each on its own sequence, the weight gradients "
               "all-reduced over CP x DP; tp x ranks x dp <= the MPI job's ranks")
          .def("[1]")
          .to(&Deck::dp),
      integers("sweep", "decode_tokens", 1, INT32_MAX, "decode: query tokens decoded against the KV cache (tokens)")
          .def("[1]")
          .to(&Deck::decode_tokens),
      list_of("sweep", "dispatch", dispatch_names(),
              "which tokens each rank holds: \"layout\" the scheme's own, or a dispatch (the schemes that take one "
              "say so in --list-schemes); contiguous, zigzag, striped, doc-zigzag (zigzag in each document), area "
              "(chunks by "
              "mask area to the least-loaded rank)")
          .def("[\"layout\"]")
          .to(&Deck::dispatch),
      key("sweep", "documents", KeyType::Documents,
          "packed documents of any lengths, with run.mask = \"documents\": each item a mix, a file of lengths (one a "
          "line) or an array of lengths, filling each seq_len (the last document cut there)")
          .def("[]", "none: documents of run.doc_len")
          .to(&Deck::documents),
  };
  for (const cp::Setting& st : cp::all_settings()) {
    auto set = [name = st.name](Deck& d, const KeyValue& v) { d.settings[name] = from_value<std::vector<int>>(v); };
    auto get = [name = st.name](const Deck& d) { return to_value(d.settings.at(name)); };
    rows.push_back(integers("sweep", st.name, st.min_value, INT32_MAX, st.help)
                       .def("[" + std::to_string(st.default_value) + "]")
                       .to(set, get));
  }
  return rows;
}

std::vector<Row> output_rows() {
  return {text("output", "file", "the HDF5 results file (--out overrides it)")
              .def("\"\"", "no results file")
              .in_resolved(InResolved::WhenSet)
              .to(&Deck::output_file)};
}

}  // namespace

const std::vector<DeckKey>& deck_keys() {
  static const std::vector<DeckKey> keys = [] {
    std::vector<DeckKey> out;
    for (const auto& rows : {model_rows(), run_rows(), mesh_rows(), sweep_rows(), output_rows()})
      for (const Row& r : rows) out.push_back(r.k);
    return out;
  }();
  return keys;
}

}  // namespace minicp::run
