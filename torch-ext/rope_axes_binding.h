// Torch-facing entry points of kernel_src/rope_axes.h (placeholder).
#pragma once

#include <torch/library.h>

void register_rope_axes_ops(torch::Library& ops);
