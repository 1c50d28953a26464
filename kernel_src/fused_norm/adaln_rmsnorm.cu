// Instantiates the fused norm launcher of adaln_rmsnorm (LTX, Flux AdaLN):
// one translation unit per op, so the variants compile in parallel.
#include "fused_norm.cuh"

namespace ltx {
namespace fused {
LTX_FUSED_NORM_INSTANTIATE(Variant::kAdalnRmsnorm)
}  // namespace fused
}  // namespace ltx
