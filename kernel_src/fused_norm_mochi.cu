// Instantiates the fused norm launchers of Mochi's gated and modulated norms.
#include "fused_norm.cuh"

namespace ltx {
namespace fused {
LTX_FUSED_NORM_INSTANTIATE(Variant::kTanhBase)
LTX_FUSED_NORM_INSTANTIATE(Variant::kScaleFloat)
}  // namespace fused
}  // namespace ltx
