// Instantiates the layernorm backward launcher of gated_residual_layernorm (the seam): one
// translation unit per op, so the variants compile in parallel.
#include "layernorm_bwd.cuh"

namespace ltx {
namespace ln {
LTX_LAYERNORM_BWD_INSTANTIATE(Variant::kGatedResidualLayerNorm)
}  // namespace ln
}  // namespace ltx
