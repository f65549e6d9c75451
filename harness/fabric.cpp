// Fabric profiles: reading, requirement checks, the environment, and what MPI selected (see
// fabric.hpp).
#include "harness/fabric.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>

#include "harness/input.hpp"
#include "harness/main.hpp"

extern "C" int minicp_ompi_selection(char* pml, size_t pml_len, char* btls, size_t btls_len);

namespace minicp::harness {
namespace {

bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string w; std::getline(ss, w, sep);)
    if (!w.empty()) out.push_back(w);
  return out;
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (const std::string& w : v) s += (s.empty() ? "" : sep) + w;
  return s;
}

// The applied profile, for applied_fabric() (set once, before MPI starts).
std::unique_ptr<FabricProfile>& applied() {
  static std::unique_ptr<FabricProfile> p;
  return p;
}

// String-valued keys of a table, in file order ("[mca]", "[env]"); numbers and booleans are
// written as TOML writes them, so `btl_tcp_eager_limit = 65536` works too.
std::vector<std::pair<std::string, std::string>> string_table(const toml::table& t, const std::string& where) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [k, v] : t) {
    if (v.is_string())
      out.emplace_back(std::string(k.str()), *v.value<std::string>());
    else if (v.is_integer())
      out.emplace_back(std::string(k.str()), std::to_string(*v.value<int64_t>()));
    else if (v.is_boolean())
      out.emplace_back(std::string(k.str()), *v.value<bool>() ? "1" : "0");
    else
      throw UsageError(where + "." + std::string(k.str()) + ": expected a string or an integer");
  }
  return out;
}

// A profile is data that users share: it may only tune the fabric. An MCA parameter must belong
// to a transport framework (selection and tuning); a variable must be a transport library's.
// Neither may name a path, file, directory, plug-in, module or program: those load or run code
// (mca_base_component_path, LD_PRELOAD, NCCL_NET_PLUGIN, FI_PROVIDER_PATH, UCX_MODULE_DIR) or
// write files outside the run.
const std::vector<std::string> kMcaFrameworks = {"pml", "btl", "mtl", "osc", "coll", "bml", "topo", "io"};
const std::vector<std::string> kEnvPrefixes = {"UCX_", "NCCL_", "FI_", "PSM2_", "PSM3_", "HCOLL_", "UCC_", "MXM_"};
// Words (between underscores) of a name that points at code or files.
const std::vector<std::string> kCodeWords = {
    "path",    "paths",   "file", "files", "filename", "dir",    "dirs",   "directory", "plugin",  "plugins",
    "module",  "modules", "lib",  "libs",  "library",  "agent",  "exec",   "prog",      "program", "cmd",
    "command", "preload", "hook", "hooks", "prefix",   "script", "binary", "tmpdir"};

bool safe_name_chars(const std::string& k, bool upper) {
  if (k.empty()) return false;
  for (char c : k)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '_' ||
          (upper ? (c >= 'A' && c <= 'Z') : (c >= 'a' && c <= 'z'))))
      return false;
  return !std::isdigit(static_cast<unsigned char>(k[0])) && k[0] != '_';
}

bool names_code(const std::string& k) {
  std::string low = k;
  for (char& c : low) c = char(std::tolower(static_cast<unsigned char>(c)));
  for (const std::string& w : split(low, '_'))
    if (std::find(kCodeWords.begin(), kCodeWords.end(), w) != kCodeWords.end()) return true;
  return false;
}

// "" when the [mca] or [env] entry may be applied, else why not (the caller names the key).
std::string entry_problem(bool mca, const std::string& k, const std::string& v) {
  if (!safe_name_chars(k, !mca))
    return mca ? "not an MCA parameter name (lower-case letters, digits and _)"
               : "not a variable name (upper-case letters, digits and _)";
  if (mca) {
    const std::string fw = k.substr(0, k.find('_'));
    if (std::find(kMcaFrameworks.begin(), kMcaFrameworks.end(), fw) == kMcaFrameworks.end())
      return "not a parameter of a transport framework (allowed: " + join(kMcaFrameworks) + " and their _ tuning)";
  } else if (std::none_of(kEnvPrefixes.begin(), kEnvPrefixes.end(),
                          [&](const std::string& pre) { return k.rfind(pre, 0) == 0 && k.size() > pre.size(); })) {
    return "not a transport library's variable (allowed: " + join(kEnvPrefixes, "*, ") + "*)";
  }
  if (names_code(k)) return "names a path, file, plug-in or program, which a profile may not set";
  if (has_control_char(v)) return "its value holds a control character";
  return "";
}

void check_entries(const std::vector<std::pair<std::string, std::string>>& entries, bool mca, const std::string& f) {
  for (const auto& [k, v] : entries) {
    const std::string why = entry_problem(mca, k, v);
    if (!why.empty()) throw UsageError(f + (mca ? "mca." : "env.") + "\"" + printable(k) + "\": " + why);
  }
}

const std::vector<std::string> kRequirementKinds = {
    "openmpi", "ompi:<framework>/<component>", "ucx:<transport>", "ib", "gpu", "nccl", "nodes:<n>"};

bool known_requirement(const std::string& r) {
  if (r == "openmpi" || r == "ib" || r == "gpu" || r == "nccl") return true;
  if (r.rfind("ompi:", 0) == 0) return r.find('/') != std::string::npos;
  if (r.rfind("ucx:", 0) == 0) return r.size() > 4;
  if (r.rfind("nodes:", 0) == 0) return std::atoi(r.c_str() + 6) >= 1;
  return false;
}

void read_profile(FabricProfile& p, const toml::table& t) {
  const std::string f = "fabric profile " + p.path + ": ";
  for (const auto& [k, v] : t) {
    const std::string key(k.str());
    if (key == "description" && v.is_string())
      p.description = *v.value<std::string>();
    else if (key == "kind" && v.is_string())
      p.kind = *v.value<std::string>();
    else if (key == "communicator" && v.is_string())
      p.communicator = *v.value<std::string>();
    else if (key == "requires" && v.is_array()) {
      for (const toml::node& e : *v.as_array()) {
        if (!e.is_string() || !known_requirement(*e.value<std::string>()))
          throw UsageError(f + "requires: each entry is one of " + join(kRequirementKinds));
        p.requirements.push_back(*e.value<std::string>());
      }
    } else if (key == "mca" && v.is_table()) {
      p.mca = string_table(*v.as_table(), f + "mca");
      check_entries(p.mca, true, f);
    } else if (key == "env" && v.is_table()) {
      p.env = string_table(*v.as_table(), f + "env");
      check_entries(p.env, false, f);
    } else if (key == "link" && v.is_table()) {
      const toml::table& l = *v.as_table();
      p.bandwidth_gbit_s = l["bandwidth_gbit_s"].value_or(0.0);
      p.latency_us = l["latency_us"].value_or(0.0);
      p.link_source = l["source"].value_or(std::string());
    } else if (key == "emulated" && v.is_table()) {
      p.emulated_rate = (*v.as_table())["rate"].value_or(std::string());
      p.emulated_nodes = int((*v.as_table())["nodes"].value_or(int64_t(2)));
    } else {
      throw UsageError(f + "unknown or mistyped key " + key +
                       " (allowed: description, kind, communicator, requires, [mca], [env], [link], [emulated])");
    }
  }
  if (p.kind != "local" && p.kind != "emulated" && p.kind != "cluster")
    throw UsageError(f + "kind = \"" + p.kind + "\": not one of local, emulated, cluster");
  if (p.communicator != "mpi" && p.communicator != "nccl")
    throw UsageError(f + "communicator = \"" + p.communicator + "\": not one of mpi, nccl");
  if (p.description.empty()) throw UsageError(f + "description: missing (one line saying what the profile is)");
}

// Open MPI's component directory: next to libmpi (Debian: <libdir>/openmpi/lib/openmpi3).
std::string ompi_component_dir() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&MPI_Init), &info) || !info.dli_fname) return "";
  std::string dir(info.dli_fname);
  dir = dir.substr(0, dir.rfind('/'));
  for (const char* sub : {"/openmpi/lib/openmpi3", "/openmpi", "/openmpi3"})
    if (exists(dir + sub + std::string("/mca_pml_ob1.so"))) return dir + sub;
  return "";
}

// The transports `ucx_info -d` lists ("posix", "sysv", "self", "tcp", "cma", "rc_mlx5", ...).
std::vector<std::string> ucx_transports(bool& have_tool) {
  std::vector<std::string> out;
  FILE* f = popen("ucx_info -d 2>/dev/null", "r");
  have_tool = false;
  if (!f) return out;
  char line[512];
  while (std::fgets(line, sizeof line, f)) {
    const char* t = std::strstr(line, "Transport: ");
    if (!t) continue;
    std::string name(t + 11);
    name.erase(name.find_last_not_of(" \n\r\t") + 1);
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  have_tool = pclose(f) == 0;
  return out;
}

std::string unmet(const FabricProfile& p, const std::string& r) {
  const std::string who = "fabric " + p.name + " requires " + r + ": ";
  if (r == "openmpi") {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);  // callable before MPI_Init
    return std::string(lib, size_t(len)).find("Open MPI") != std::string::npos ? ""
                                                                               : who + "this program runs another MPI";
  }
  if (r.rfind("ompi:", 0) == 0) {
    const std::string fw = r.substr(5, r.find('/') - 5), comp = r.substr(r.find('/') + 1);
    const std::string dir = ompi_component_dir();
    if (dir.empty()) return "";  // components built into libmpi: Open MPI reports a missing one itself
    return exists(dir + "/mca_" + fw + "_" + comp + ".so")
               ? ""
               : who + "Open MPI has no " + fw + " component " + comp + " (not in " + dir + ")";
  }
  if (r.rfind("ucx:", 0) == 0) {
    bool tool = false;
    const std::vector<std::string> tls = ucx_transports(tool);
    if (!tool) return who + "ucx_info (ucx-utils) is not installed, so the UCX transports cannot be checked";
    const std::string want = r.substr(4);
    for (const std::string& t : tls)
      if (t == want || t.rfind(want + "_", 0) == 0) return "";
    return who + "UCX transport " + want + " is not available on this machine (ucx_info -d lists: " + join(tls) + ")";
  }
  if (r == "ib") {
    DIR* d = opendir("/sys/class/infiniband");
    bool any = false;
    if (d) {
      for (dirent* e; (e = readdir(d));) any = any || e->d_name[0] != '.';
      closedir(d);
    }
    return any ? "" : who + "no InfiniBand device (/sys/class/infiniband is empty or absent)";
  }
  if (r == "gpu") return exists("/dev/nvidiactl") ? "" : who + "no NVIDIA GPU (/dev/nvidiactl absent)";
  if (r == "nccl") {
    void* h = dlopen("libnccl.so.2", RTLD_LAZY | RTLD_LOCAL);
    if (h) dlclose(h);
    return h ? "" : who + "libnccl.so.2 cannot be loaded";
  }
  return "";  // nodes:N: after MPI_Init
}

// The job's rank as the launcher states it before MPI_Init (-1: unknown).
int launcher_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* e = std::getenv(v)) return std::atoi(e);
  return -1;
}

// The ranks of comm on this rank's node (collective).
int node_local_ranks(MPI_Comm comm) {
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int n = 1;
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  return n;
}

// The number of distinct host names among the ranks of comm (collective).
int distinct_hosts(MPI_Comm comm) {
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0, size = 1;
  MPI_Get_processor_name(host, &len);
  MPI_Comm_size(comm, &size);
  std::vector<char> all(size_t(size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, comm);
  std::vector<std::string> hosts;
  for (int i = 0; i < size; ++i) hosts.emplace_back(&all[size_t(i) * MPI_MAX_PROCESSOR_NAME]);
  std::sort(hosts.begin(), hosts.end());
  return int(std::unique(hosts.begin(), hosts.end()) - hosts.begin());
}

}  // namespace

std::string FabricProfile::expect_pml() const {
  for (const auto& [k, v] : mca)
    if (k == "pml" && v.find_first_of("^,") == std::string::npos) return v;
  return "";
}

std::vector<std::string> FabricProfile::expect_btls() const {
  for (const auto& [k, v] : mca)
    if (k == "btl" && !v.empty() && v[0] != '^') return split(v, ',');
  return {};
}

std::string FabricProfile::settings() const {
  std::string s;
  for (const auto& [k, v] : mca) s += (s.empty() ? "" : " ") + ("OMPI_MCA_" + k) + "=" + v;
  for (const auto& [k, v] : env) s += (s.empty() ? "" : " ") + k + "=" + v;
  return s;
}

std::string MpiSelection::btl_list() const { return join(btls, ","); }

MpiSelection mpi_selection() {
  MpiSelection s;
  char pml[128], btls[512];
  const int rc = minicp_ompi_selection(pml, sizeof pml, btls, sizeof btls);
  if (rc == 1) {
    s.pml = pml, s.btls = split(btls, ','), s.how = "open-mpi internals";
  } else {
    s.how = rc == 0 ? "unknown: not Open MPI (its selection symbols are absent)"
                    : "unknown: built without Open MPI's internal headers";
  }
  return s;
}

std::string fabric_dir() { return inputs_dir("MINICP_FABRICS", "fabrics"); }

std::vector<std::string> fabric_names() { return toml_names(fabric_dir()); }

FabricProfile load_fabric(const std::string& name_or_path, const std::string& flag) {
  FabricProfile p;
  const bool is_path = name_or_path.find('/') != std::string::npos ||
                       (name_or_path.size() > 5 && name_or_path.rfind(".toml") == name_or_path.size() - 5);
  p.path = is_path ? name_or_path : fabric_dir() + "/" + name_or_path + ".toml";
  const size_t slash = p.path.rfind('/');
  p.name = p.path.substr(slash == std::string::npos ? 0 : slash + 1);
  if (p.name.size() > 5 && p.name.rfind(".toml") == p.name.size() - 5) p.name.resize(p.name.size() - 5);
  if (!exists(p.path))
    throw UsageError(flag + " " + name_or_path + ": no such fabric profile" +
                     (is_path ? std::string() : " (known in " + fabric_dir() + ": " + join(fabric_names()) + ")"));
  std::string text;
  try {
    text = read_input_file(p.path, kFabricFile);
  } catch (const std::runtime_error& e) {
    throw UsageError(flag + " " + name_or_path + ": " + e.what());
  }
  try {
    read_profile(p, toml::parse(text, p.path));
  } catch (const toml::parse_error& e) {
    throw UsageError(flag + " " + name_or_path + ": " + p.path + ":" + std::to_string(e.source().begin.line) +
                     ": malformed TOML: " + std::string(e.description()));
  }
  return p;
}

std::string unmet_requirement(const FabricProfile& p) {
  for (const std::string& r : p.requirements) {
    const std::string why = unmet(p, r);
    if (!why.empty()) return why;
  }
  return "";
}

std::string flag_value(int argc, char** argv, const std::string& flag) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == flag && i + 1 < argc) return argv[i + 1];
    if (a.rfind(flag + "=", 0) == 0) return a.substr(flag.size() + 1);
  }
  return "";
}

std::string deck_fabric(const std::string& path) {
  try {
    const toml::table t = toml::parse(read_input_file(path, kDeckFile), path);
    return t["run"]["fabric"].value_or(std::string());
  } catch (const std::exception&) {
    return "";
  }
}

namespace {

// The first variable the profile sets that the environment already holds with another value
// (from mpirun --mca, -x or the shell), as a message; "" when none.
std::string env_conflict(const FabricProfile& p) {
  std::vector<std::pair<std::string, std::string>> vars;
  for (const auto& [k, v] : p.mca) vars.emplace_back("OMPI_MCA_" + k, v);
  vars.insert(vars.end(), p.env.begin(), p.env.end());
  for (const auto& [k, v] : vars) {
    const char* had = std::getenv(k.c_str());
    if (had && v != had)
      return "fabric " + p.name + " sets " + k + "=" + v + " but the environment has " + k + "=" + had +
             " (from mpirun --mca, -x or the shell): remove one";
  }
  return "";
}

}  // namespace

int apply_fabric(const char* prog, const FabricRequest& req) {
  if (req.name.empty()) return -1;
  std::string msg;
  try {
    FabricProfile p = load_fabric(req.name, req.flag);
    msg = unmet_requirement(p);
    // A conflict with the environment mpirun gave every rank: the environment may not even
    // start MPI (its own settings), so it ends here, said by rank 0 as the launcher numbers it.
    if (const std::string conflict = msg.empty() ? env_conflict(p) : ""; !conflict.empty()) {
      if (launcher_rank() <= 0) std::fprintf(stderr, "%s: %s\n", prog, printable(conflict).c_str());
      return 2;
    }
    // All of it or none: a refused profile leaves the environment as it was.
    for (const auto& [k, v] : p.mca)
      if (msg.empty() && setenv(("OMPI_MCA_" + k).c_str(), v.c_str(), 1) != 0)
        msg = "fabric " + p.name + ": cannot set OMPI_MCA_" + k;
    for (const auto& [k, v] : p.env)
      if (msg.empty() && setenv(k.c_str(), v.c_str(), 1) != 0) msg = "fabric " + p.name + ": cannot set " + k;
    if (msg.empty()) applied() = std::make_unique<FabricProfile>(std::move(p));
  } catch (const UsageError& e) {
    msg = e.what();
  }
  // Reported in the parse step, once, whichever ranks it failed on (set_startup_error).
  if (!msg.empty()) set_startup_error(msg);
  return -1;
}

const FabricProfile* applied_fabric() { return applied().get(); }

MpiSelection verify_fabric(MPI_Comm comm) {
  const MpiSelection sel = mpi_selection();
  const FabricProfile* p = applied_fabric();
  std::string msg;
  if (p) {
    const std::string pml = p->expect_pml();
    const std::vector<std::string> btls = p->expect_btls();
    const bool known = !sel.pml.empty();
    // A shared-memory BTL starts only where a rank has a peer on its node: with one rank per
    // node, vader's absence is what was asked for. (Collective: outside the rank's branches.)
    const bool alone = node_local_ranks(comm) == 1;
    if (!known && (!pml.empty() || !btls.empty()))
      msg = "fabric " + p->name + ": cannot check what MPI selected (" + sel.how + ")";
    else if (!pml.empty() && sel.pml != pml)
      msg = "fabric " + p->name + " asked for PML " + pml + " but MPI selected " + sel.pml;
    else if (!btls.empty() && sel.pml == "ob1") {
      for (const std::string& b : btls) {
        const bool shm = b == "vader" || b == "sm" || b == "smcuda";
        if (!(shm && alone) && std::find(sel.btls.begin(), sel.btls.end(), b) == sel.btls.end())
          msg = "fabric " + p->name + " asked for BTLs " + join(btls, ",") + " but MPI initialised " + sel.btl_list();
      }
    }
    for (const std::string& r : p->requirements) {
      if (r.rfind("nodes:", 0) != 0) continue;
      const int n = distinct_hosts(comm);  // collective: the profile, so this loop, is the same on every rank
      if (n < std::atoi(r.c_str() + 6) && msg.empty())
        msg = "fabric " + p->name + " requires " + r + " but the job runs on " + std::to_string(n) +
              " host(s) (an emulated profile: launch through slurm/vcluster mpirun)";
    }
  }
  // Every rank learns the first failing rank's message and throws it: rank 0 prints it once.
  int rank = 0, first = INT_MAX;
  MPI_Comm_rank(comm, &rank);
  const int mine = msg.empty() ? INT_MAX : rank;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first != INT_MAX) {
    int64_t n = int64_t(msg.size());
    MPI_Bcast(&n, 1, MPI_INT64_T, first, comm);
    msg.resize(size_t(n));
    MPI_Bcast(msg.data(), int(n), MPI_CHAR, first, comm);
    throw UsageError(msg);
  }
  return sel;
}

}  // namespace minicp::harness
