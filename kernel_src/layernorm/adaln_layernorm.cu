// Instantiates the layernorm launcher of adaln_layernorm (Wan's norm1 / norm3 /
// norm_out, Flux and HunyuanVideo's AdaLayerNormZero / AdaLayerNormContinuous):
// one translation unit per op, so the variants compile in parallel.
#include "layernorm.cuh"

namespace ltx {
namespace ln {
LTX_LAYERNORM_INSTANTIATE(Variant::kAdalnLayerNorm)
}  // namespace ln
}  // namespace ltx
