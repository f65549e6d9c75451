// The BLAS that runs and its core (see blas.hpp).
#include "harness/blas.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

namespace minicp::harness {
namespace {

constexpr const char* kSelectedVar = "MINICP_BLAS_SELECTED";  // set by the re-execution: the core OpenBLAS detected
std::string g_reexec_failure;                                 // why select_blas_core could not re-execute

using NameFn = char* (*)();
NameFn openblas_fn(const char* name) { return reinterpret_cast<NameFn>(::dlsym(RTLD_DEFAULT, name)); }

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The first "model name" and the "flags" of /proc/cpuinfo (x86 Linux; empty elsewhere).
void read_cpuinfo(std::string& model, std::set<std::string>& flags) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  bool have_model = false, have_flags = false;
  while (std::getline(in, line) && !(have_model && have_flags)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name" && !have_model) model = value, have_model = true;
    if (key == "flags" && !have_flags) {
      std::istringstream words(value);
      for (std::string w; words >> w;) flags.insert(w);
      have_flags = true;
    }
  }
}

// The tier the flags offer: AVX-512 as OpenBLAS's SkylakeX kernels need it (F, VL, BW, DQ).
Isa isa_of_flags(const std::set<std::string>& f) {
  if (f.empty()) return Isa::Unknown;
  auto has = [&](const char* x) { return f.count(x) > 0; };
  if (has("avx512f") && has("avx512vl") && has("avx512bw") && has("avx512dq")) return Isa::Avx512;
  if (has("avx2") && has("fma")) return Isa::Avx2;
  if (has("avx")) return Isa::Avx;
  return Isa::Sse;
}

std::string vector_flags(const std::set<std::string>& f) {
  std::string s;
  for (const char* x : {"sse3", "avx", "fma", "avx2", "avx512f", "avx512vl", "avx512bw", "avx512dq", "avx512_bf16",
                        "avx512_fp16", "amx_tile", "amx_bf16"})
    if (f.count(x)) s += (s.empty() ? "" : " ") + std::string(x);
  return s;
}

// The real path of the shared object holding `symbol` ("" when not found).
std::string library_of(const char* symbol) {
  void* p = ::dlsym(RTLD_DEFAULT, symbol);
  Dl_info info{};
  if (!p || ::dladdr(p, &info) == 0 || !info.dli_fname) return "";
  char real[PATH_MAX];
  return ::realpath(info.dli_fname, real) ? std::string(real) : std::string(info.dli_fname);
}

}  // namespace

const char* to_string(Isa i) {
  switch (i) {
    case Isa::Sse: return "SSE";
    case Isa::Avx: return "AVX";
    case Isa::Avx2: return "AVX2";
    case Isa::Avx512: return "AVX-512";
    default: return "unknown";
  }
}

std::string core_for(Isa cpu) {
  switch (cpu) {
    case Isa::Avx512: return "SkylakeX";
    case Isa::Avx2: return "Haswell";
    case Isa::Avx: return "Sandybridge";
    default: return "";
  }
}

Isa isa_of_core(const std::string& core) {
  static const std::vector<std::pair<std::vector<std::string>, Isa>> tiers = {
      {{"skylakex", "cooperlake", "sapphirerapids"}, Isa::Avx512},
      {{"haswell", "zen"}, Isa::Avx2},
      {{"sandybridge", "bulldozer", "piledriver", "steamroller", "excavator"}, Isa::Avx}};
  const std::string c = lower(core);
  if (c.empty()) return Isa::Unknown;
  for (const auto& [names, isa] : tiers)
    if (std::find(names.begin(), names.end(), c) != names.end()) return isa;
  return Isa::Sse;  // Prescott, Core2, Nehalem, Katmai, Atom, Opteron, ...: the generic kernels
}

BlasInfo blas_info() {
  BlasInfo b;
  std::set<std::string> flags;
  read_cpuinfo(b.cpu_model, flags);
  b.cpu_isa = isa_of_flags(flags);
  b.cpu_flags = vector_flags(flags);
  b.library = library_of("sgemm_");
  const NameFn config = openblas_fn("openblas_get_config"), corename = openblas_fn("openblas_get_corename");
  if (!config || !corename) {
    b.name = "unknown";
    return b;
  }
  b.name = "OpenBLAS";
  b.config = config();
  std::istringstream words(b.config);
  std::string first;
  words >> first >> b.version;  // "OpenBLAS 0.3.21 ..."
  b.core = corename();
  b.core_isa = isa_of_core(b.core);
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  const char* selected = std::getenv(kSelectedVar);
  if (selected && user)
    b.core_source = "selected by minicp (OpenBLAS detected " + std::string(selected) + ")";
  else if (user)
    b.core_source = "OPENBLAS_CORETYPE=" + std::string(user) + " (user's setting)";
  else
    b.core_source = "detected by OpenBLAS";
  if (b.cpu_isa != Isa::Unknown && b.core_isa < b.cpu_isa) {
    b.warning = "OpenBLAS runs the " + b.core + " core (" + to_string(b.core_isa) + " kernels, " + b.core_source +
                ") on a CPU that offers " + to_string(b.cpu_isa) + " (OPENBLAS_CORETYPE=" + core_for(b.cpu_isa) +
                "): BLAS GEMMs run slower than this machine can";
    if (!g_reexec_failure.empty()) b.warning += "; selecting the core failed: " + g_reexec_failure;
  }
  return b;
}

std::string BlasInfo::summary() const {
  if (core.empty()) return name + (library.empty() ? "" : " (" + library + ")");
  return name + " " + version + ", core " + core + " (" + core_source + ")";
}

std::string core_to_select(const std::string& detected, Isa cpu, bool user_set) {
  if (user_set || isa_of_core(detected) >= cpu) return "";
  return core_for(cpu);
}

void select_blas_core(char** argv) {
  if (std::getenv(kSelectedVar)) return;  // this is the second start
  const NameFn corename = openblas_fn("openblas_get_corename");
  if (!corename) return;
  std::string model;
  std::set<std::string> flags;
  read_cpuinfo(model, flags);
  const std::string detected = corename();
  const std::string want = core_to_select(detected, isa_of_flags(flags), std::getenv("OPENBLAS_CORETYPE") != nullptr);
  if (want.empty()) return;
  ::setenv("OPENBLAS_CORETYPE", want.c_str(), 1);
  ::setenv(kSelectedVar, detected.c_str(), 1);
  ::execv("/proc/self/exe", argv);  // returns only on failure
  g_reexec_failure = "re-executing /proc/self/exe failed";
  ::unsetenv("OPENBLAS_CORETYPE");
  ::unsetenv(kSelectedVar);
}

}  // namespace minicp::harness
