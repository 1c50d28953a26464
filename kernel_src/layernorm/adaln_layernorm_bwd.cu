// Instantiates the layernorm backward launcher of adaln_layernorm: one
// translation unit per op, so the variants compile in parallel.
#include "layernorm_bwd.cuh"

namespace ltx {
namespace ln {
LTX_LAYERNORM_BWD_INSTANTIATE(Variant::kAdalnLayerNorm)
}  // namespace ln
}  // namespace ltx
