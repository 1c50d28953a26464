// Instantiates the fused norm launchers of the residual variants.
#include "fused_norm.cuh"

namespace ltx {
namespace fused {
LTX_FUSED_NORM_INSTANTIATE(Variant::kResidualNorm)
LTX_FUSED_NORM_INSTANTIATE(Variant::kResidual)
}  // namespace fused
}  // namespace ltx
