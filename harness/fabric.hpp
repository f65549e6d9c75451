// Fabric profiles: a named set of MPI / UCX / NCCL settings (inputs/fabrics/NAME.toml) that a
// run asks for with --fabric NAME (or the deck's run.fabric). The settings are put into the
// environment before MPI_Init (Open MPI reads OMPI_MCA_* there when it starts), and after
// MPI_Init what MPI really selected is read back and compared: a run that asked for UCX and got
// ob1 stops with exit code 2 instead of measuring the wrong fabric. A profile whose transport
// this machine lacks is refused before MPI starts, naming the transport.
//
// Profile file (every key but description optional):
//   description = "one line"
//   kind = "local" | "emulated" | "cluster"   (cluster: documented, not runnable here)
//   communicator = "mpi" | "nccl"             (the CP exchanges' backend; default mpi)
//   requires = ["openmpi", "ompi:pml/ucx", "ucx:posix", "ib", "gpu", "nccl", "nodes:2"]
//   [mca]  pml = "ob1", btl = "self,vader", ...   Open MPI MCA parameters (OMPI_MCA_<key>)
//   [env]  UCX_TLS = "posix,self", NCCL_IB_HCA = "mlx5", ...
//   [link] bandwidth_gbit_s = 400.0, latency_us = 1.0, source = "..."  (figures it assumes)
//   [emulated] rate = "1gbit", nodes = 2    (slurm/vcluster up <nodes> --rate <rate>)
#pragma once
#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

namespace minicp::harness {

struct FabricProfile {
  std::string name;         // the file's stem ("ob1-vader")
  std::string path;         // the file it was read from
  std::string description;  // one line
  std::string kind = "local";
  std::string communicator = "mpi";                      // mpi | nccl: what the schemes' exchanges go through
  std::vector<std::string> requirements;                 // see above
  std::vector<std::pair<std::string, std::string>> mca;  // MCA parameter -> value
  std::vector<std::pair<std::string, std::string>> env;  // variable -> value
  double bandwidth_gbit_s = 0, latency_us = 0;           // the link it assumes (0: not stated)
  std::string link_source;                               // where those figures come from
  std::string emulated_rate;                             // vcluster --rate ("" not emulated)
  int emulated_nodes = 0;
  // What MPI must select: the PML named by mca.pml, and the BTLs of mca.btl when it is a plain
  // list (not "^exclusions"); empty: not checked.
  std::string expect_pml() const;
  std::vector<std::string> expect_btls() const;
  // The environment it sets, "OMPI_MCA_pml=ob1 UCX_TLS=posix,self" (for records and logs).
  std::string settings() const;
};

// What MPI selected, read after MPI_Init. Open MPI: the PML component and the initialised BTL
// modules (through its own symbols; `how` says "open-mpi internals"). Another MPI, or an
// Open MPI this build cannot look into: pml "" and `how` says why.
struct MpiSelection {
  std::string pml;
  std::vector<std::string> btls;
  std::string how;
  std::string btl_list() const;  // "self,vader"
};
MpiSelection mpi_selection();

// The directory profiles are looked up in: $MINICP_FABRICS, else the source tree's inputs/fabrics.
std::string fabric_dir();
// The profile names in fabric_dir(), sorted.
std::vector<std::string> fabric_names();

// Reads a profile: a name in fabric_dir(), or a path (it has a '/' or ends in .toml).
// `flag` names where the name came from ("--fabric", "run.fabric") for messages.
// Throws UsageError: unknown name (listing the known ones), unreadable or malformed file,
// unknown key or requirement.
FabricProfile load_fabric(const std::string& name_or_path, const std::string& flag);

// "" when this machine has what the profile requires before MPI starts (nodes:N is checked
// after MPI_Init), else one sentence naming the missing transport.
std::string unmet_requirement(const FabricProfile& p);

// A requested profile and where the request came from ("--fabric", "run.fabric", ...).
struct FabricRequest {
  std::string name;  // "" none
  std::string flag;
};
// The value of `--flag V` or `--flag=V` in argv ("" when absent).
std::string flag_value(int argc, char** argv, const std::string& flag);
// The run.fabric value of the input deck at path ("" when it names none or cannot be read:
// the deck's own reading reports what is wrong with it). Here, with the profiles' TOML
// reading, so that the callers need no TOML parser of their own.
std::string deck_fabric(const std::string& path);

// Before MPI_Init: loads the requested profile, checks its requirements and puts its settings
// into the environment. A variable already set to another value (mpirun --mca, -x, the user's
// shell) is a conflict, refused rather than silently overridden: returns 2 after rank 0 (as
// the launcher names it) printed it, before MPI starts. Any other refusal sets nothing, and
// its message becomes the parse step's bad input (set_startup_error), which every rank agrees
// on and one prints, exit code 2 (a profile may fail on one node only). Else returns -1.
int apply_fabric(const char* prog, const FabricRequest& req);

// The profile apply_fabric applied (nullptr: none).
const FabricProfile* applied_fabric();

// After MPI_Init, collectively: checks that MPI selected what the applied profile asks for
// (PML, BTLs, nodes:N) and throws UsageError on every rank when it did not. Returns what was
// selected (for the records), also without a profile.
MpiSelection verify_fabric(MPI_Comm comm);

}  // namespace minicp::harness
