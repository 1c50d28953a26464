// Torch-facing entry points of kernel_src/qk_norm_rope.h (placeholder).
#pragma once

#include <torch/library.h>

void register_qk_norm_rope_ops(torch::Library& ops);
