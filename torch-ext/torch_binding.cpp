// The op registry: every family registers its ops here (see torch_binding.h).
#include "registration.h"
#include "torch_binding.h"

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  register_rmsnorm(ops);
  register_fused_norm(ops);
  register_layernorm(ops);
  register_activation(ops);
  register_rope(ops);
  register_rope_axes(ops);
  register_qk_rmsnorm_rope(ops);
  register_vae(ops);
  register_fp8(ops);
#ifdef LTX_KERNELS_DEV
  register_dev(ops);
#endif
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
