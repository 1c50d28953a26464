// Instantiates the fused norm launcher of gated_residual:
// one translation unit per op, so the variants compile in parallel.
#include "fused_norm.cuh"

namespace ltx {
namespace fused {
LTX_FUSED_NORM_INSTANTIATE(Variant::kGatedResidual)
}  // namespace fused
}  // namespace ltx
