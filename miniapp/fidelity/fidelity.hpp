// The numerical fidelity of a CP scheme at the job's rank count: the error of its outputs and
// gradients in fp32 and bf16 against fp64 on the same inputs, beside the error of the
// single-rank reference `none` in the same precision. Two levels: one attention call (O, LSE,
// dQ, dK, dV) and a stack of decoder layers (the output y, the input gradient dx and every
// weight gradient). Every precision is handed the same values: the inputs (and the stack's
// weights) are drawn by the model's generator and rounded to bf16, which fp32 and fp64 hold
// exactly, so what differs is the arithmetic alone.
//
// Figures, over the whole global tensor (all ranks' rows): rel_fro = ||x - x64||_F / ||x64||_F
// and max_rel = max |x - x64| / max |x64|. A figure of a scheme divided by the same figure of
// `none` in the same precision is its ratio (DESIGN.md's rule: at most 2).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "miniapp/cp/mask.hpp"
#include "miniapp/model/model.hpp"

namespace minicp::fidelity {

// The precisions measured: fp32; bf16 (fp32 dK/dV ring accumulators and weight-gradient
// all-reduce, as real trainers default to); bf16 with both of those in bf16 as well.
enum class Variant { F32, BF16, BF16Wire };
const char* to_string(Variant v);
constexpr Variant kVariants[] = {Variant::F32, Variant::BF16, Variant::BF16Wire};

using Mask = cp::Mask;

// One error figure of one tensor.
struct Row {
  std::string level;  // attention | layer
  std::string scheme, mask, variant, tensor;
  int ranks = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t seq_len = 0;
  double rel_fro = 0, max_rel = 0;            // the scheme's
  double none_rel_fro = 0, none_max_rel = 0;  // `none`'s, same precision, same inputs
};

// Why a case cannot run at `ranks` ("" when it can): the scheme's check on the config that
// attention_rows (level "attention": heads, kv_heads and head_dim of shape) or layer_rows
// ("layer") would build. No work, no communication.
std::string refusal(const std::string& scheme, const Mask& mask, const std::string& level, int64_t seq_len,
                    const model::Shape& shape, int ranks);

// Attention level: q (S, H, D), k, v (S, Hkv, D), dout (S, H, D) for the training schemes
// (decode schemes: T = 4 queries after an S-token cache, O and LSE only). Collective over comm.
std::vector<Row> attention_rows(const std::string& scheme, const Mask& mask, int64_t seq_len, int heads, int kv_heads,
                                int head_dim, comm::Communicator& comm);

// Layer level: a train pass of `shape` over S tokens; the tensors y, dx and d<param> of each
// layer ("l0.dwq"). Collective over comm.
std::vector<Row> layer_rows(const std::string& scheme, const Mask& mask, int64_t seq_len, const model::Shape& shape,
                            comm::Communicator& comm);

}  // namespace minicp::fidelity
