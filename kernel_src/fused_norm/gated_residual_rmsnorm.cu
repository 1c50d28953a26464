// Instantiates the fused norm launcher of gated_residual_rmsnorm (the gated residual of one LTX sub-layer and the modulated norm of the next):
// one translation unit per op, so the variants compile in parallel.
#include "fused_norm.cuh"

namespace ltx {
namespace fused {
LTX_FUSED_NORM_INSTANTIATE(Variant::kGatedResidualRmsnorm)
}  // namespace fused
}  // namespace ltx
