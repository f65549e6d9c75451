// Which BLAS really runs, and for OpenBLAS which core (kernel set) it runs. Found at run time
// through the dynamic linker (dlsym / dladdr), so a program links with any BLAS and this
// still answers: OpenBLAS is recognised by its openblas_get_config / openblas_get_corename.
//
// Why it matters: a DYNAMIC_ARCH OpenBLAS picks its core from the CPU's identity at load.
// On a CPU it does not know (a new Xeon that reports only "Intel(R) Xeon(R) Processor") it
// falls back to a generic core (Prescott: SSE3) and runs SGEMM 5x slower than the AVX-512
// kernels the CPU can run, which silently changes every GEMM time and the SGEMM reference of
// the layer efficiency. The core can only be chosen before the library initialises, through
// OPENBLAS_CORETYPE in the environment; select_blas_core() does this by re-executing the
// program once, before MPI starts. A user's own OPENBLAS_CORETYPE always wins: it is
// respected, and warned about when it names a core below what the CPU offers.
#pragma once
#include <string>

namespace minicp::harness {

// Vector instruction tiers, ordered: a core's kernels use one, a CPU offers one.
enum class Isa { Unknown = -1, Sse = 0, Avx = 1, Avx2 = 2, Avx512 = 3 };
const char* to_string(Isa i);

struct BlasInfo {
  std::string name;     // "OpenBLAS" or "unknown" (a BLAS this code cannot interrogate)
  std::string library;  // the shared object that holds sgemm_ (symbolic links resolved); "" unknown
  std::string version;  // "0.3.21" (OpenBLAS); "" unknown
  std::string config;   // openblas_get_config(): build options and the running core
  std::string core;     // openblas_get_corename(): "SkylakeX", "Haswell", "Prescott", ...; "" not OpenBLAS
  std::string
      core_source;  // "detected by OpenBLAS", "OPENBLAS_CORETYPE=X (user)", "selected by minicp (OpenBLAS detected Y)"
  Isa core_isa = Isa::Unknown;  // the tier of the core's kernels
  std::string cpu_model;        // /proc/cpuinfo "model name"
  std::string cpu_flags;        // the vector flags that matter, present on this CPU ("avx2 fma avx512f ...")
  Isa cpu_isa = Isa::Unknown;   // the best tier the CPU's flags offer
  std::string warning;          // "" or why the BLAS runs slower than this CPU allows (one sentence)
  // "OpenBLAS 0.3.21, core SkylakeX (selected by minicp: OpenBLAS detected Prescott)".
  std::string summary() const;
};

// What this process runs (cheap; reads /proc/cpuinfo once).
BlasInfo blas_info();

// The OpenBLAS core for the best tier a CPU offers ("SkylakeX", "Haswell", "Sandybridge";
// "" for SSE or unknown) and the tier of an OpenBLAS core name (case-insensitive).
std::string core_for(Isa cpu);
Isa isa_of_core(const std::string& core);

// The core select_blas_core sets: core_for(cpu) when OpenBLAS detected a core of a lower
// tier than the CPU offers and the user set none; "" otherwise.
std::string core_to_select(const std::string& detected, Isa cpu, bool user_set);

// Call first in main, before MPI_Init and before anything else starts: when the linked BLAS is
// OpenBLAS running a core of a lower tier than the CPU offers, and OPENBLAS_CORETYPE is not
// set, sets it to core_for(cpu) and re-executes the program (once; MINICP_BLAS_SELECTED marks
// the second start and says what OpenBLAS had detected). Returns when nothing needs doing or
// the re-execution failed (blas_info().warning then says so).
void select_blas_core(char** argv);

}  // namespace minicp::harness
