// One registration function per op family, each in <family>_binding.cpp:
// it defines the family's schemas and registers their CUDA (and CPU, for the
// errors that name the argument) implementations. Schema names are the
// public Python names (ltx_kernels.<op>), so errors name what the user called.
#pragma once

#include <torch/library.h>

void register_rmsnorm(torch::Library& ops);
void register_fused_norm(torch::Library& ops);
void register_layernorm(torch::Library& ops);
void register_activation(torch::Library& ops);
void register_rope(torch::Library& ops);
void register_rope_axes(torch::Library& ops);
void register_qk_rmsnorm_rope(torch::Library& ops);
void register_vae(torch::Library& ops);
void register_fp8(torch::Library& ops);

#ifdef LTX_KERNELS_DEV
// Development builds: set_tuning / tuning_knobs (dev_binding.cpp). Each family
// also registers its `<family>_path` probe (which kernel a call would take).
void register_dev(torch::Library& ops);
#endif
