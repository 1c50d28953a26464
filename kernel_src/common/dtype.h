// Element types the kernels accept, shared by the CUDA sources and the torch
// binding (which maps at::ScalarType onto it).
#pragma once

namespace ltx {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline int dtype_size(DType dt) { return dt == DType::kFloat32 ? 4 : 2; }

}  // namespace ltx
