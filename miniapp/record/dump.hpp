// The --dump file: one case of a run written whole, in global token order, so that anyone
// can recompute it independently (tests/check_dump.py does, in numpy). Layout
// (docs/results-file.md, "--dump FILE.h5"):
//   /tensors/x, /tensors/y                   [S, hidden] input, output of the last layer
//   /tensors/dy, /tensors/dx                 [S, hidden] train: upstream gradient, input gradient
//   /tensors/layers/<l>/<param>              each parameter of layer l (model::layer_params,
//                                            y = x @ W), and d<param> (train: summed over ranks)
//   /tensors/layers/<l>/cache_k, cache_v     decode: [S, kv_heads*head_dim] the KV cache
//   /mask/keys                               [Nq, 2] the first and last key position each
//                                            query row sees (cp::Mask::keys_of)
//   decode: x, y are [T, hidden], the decode tokens at positions S..S+T-1.
//   With DP (root attribute dp > 1) every activation and cache holds dp sequences, replica d's
//   at rows d*S.. (decode: d*T..), and the weight gradients are the replicas' mean.
// Root attributes describe the shape, the mask (its name), the run and the RoPE convention.
#pragma once
#include <mpi.h>

#include <string>

#include "comm/comm.hpp"
#include "miniapp/model/layer.hpp"

namespace minicp::record {

// Writes the dump of `st` (after its forward; train: after its backward too) to `path`,
// atomically (record::H5File). Collective over comm's job (every DP replica); the datasets have the stack's
// type T. `scheme` is the CP scheme's name, recorded as an attribute. Throws
// std::runtime_error naming the path (and the dataset) when the file cannot be written,
// std::logic_error when a train stack has not run its backward.
template <class T>
void write_dump(const std::string& path, const model::Stack<T>& st, const model::StackConfig& cfg,
                const std::string& scheme, comm::Communicator& comm);

// The root attribute file_kind of a dump, and "" when the existing file at path is a dump, else what it is instead
// (see record::kind_mismatch). Serial.
constexpr const char* kDumpKind = "minicp dump";
std::string not_a_dump_file(const std::string& path);

// The MPI communicator spanning comm's job (its control communicator, whatever the backend).
MPI_Comm mpi_job(const comm::Communicator& comm);

}  // namespace minicp::record
