"""The references the kernels are checked and benchmarked against, one module
per op family (rmsnorm, fused_norm, layernorm, activation, rope,
qk_rmsnorm_rope, rope_axes, vae): the float64 formula, and the models' own
eager PyTorch code (their roundings). `numerics` holds what they share: distances in ulps, every
finite value of a half type. The norms' references are also importable from
here (`from ltx_dev import reference as ref; ref.ltx_adaln_eager(...)`)."""

from .fused_norm import (adaln_f64, diffusers_mochi_modulated_rmsnorm, gated_residual_eager, genmo_modulated_rmsnorm,
                         genmo_residual_tanh_gated_rmsnorm, ltx_adaln_eager, per_batch, wan_gated_residual)
from .layernorm import (adaln_layer_norm_f64, flux_gated_residual, flux_modulated_norm, fp32_layer_norm,
                        layer_norm_f64, torch_layer_norm, wan_modulated_norm, wan_norm2)
from .numerics import every_finite_value, ulp_distance
from .rmsnorm import diffusers_rms_norm, rms_norm_f64, torch_rms_norm

__all__ = ["adaln_f64", "diffusers_mochi_modulated_rmsnorm", "gated_residual_eager", "genmo_modulated_rmsnorm",
           "genmo_residual_tanh_gated_rmsnorm", "ltx_adaln_eager", "per_batch", "wan_gated_residual",
           "adaln_layer_norm_f64", "flux_gated_residual", "flux_modulated_norm", "fp32_layer_norm", "layer_norm_f64",
           "torch_layer_norm", "wan_modulated_norm", "wan_norm2", "every_finite_value", "ulp_distance",
           "diffusers_rms_norm", "rms_norm_f64", "torch_rms_norm"]
