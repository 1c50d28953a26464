// Instantiates the fused norm launchers of the AdaLN variants (LTX, Flux).
#include "fused_norm.cuh"

namespace ltx {
namespace fused {
LTX_FUSED_NORM_INSTANTIATE(Variant::kModulate)
LTX_FUSED_NORM_INSTANTIATE(Variant::kSeam)
}  // namespace fused
}  // namespace ltx
