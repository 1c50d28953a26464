// Instantiates the layernorm launcher of gated_residual_layernorm (the block
// seam of Wan, Flux and HunyuanVideo: gated residual, then the next norm): one
// translation unit per op, so the variants compile in parallel.
#include "layernorm.cuh"

namespace ltx {
namespace ln {
LTX_LAYERNORM_INSTANTIATE(Variant::kGatedResidualLayerNorm)
}  // namespace ln
}  // namespace ltx
