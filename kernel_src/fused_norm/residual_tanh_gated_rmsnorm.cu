// Instantiates the fused norm launcher of residual_tanh_gated_rmsnorm (Mochi):
// one translation unit per op, so the variants compile in parallel.
#include "fused_norm.cuh"

namespace ltx {
namespace fused {
LTX_FUSED_NORM_INSTANTIATE(Variant::kResidualTanhGatedRmsnorm)
}  // namespace fused
}  // namespace ltx
