"""What a release build ships against a development build (`ltx-build build --dev`): the release
registers exactly the public ops, under their public names; a development build adds one
`<family>_path` probe per family and the `set_tuning` / `tuning_knobs` ops of the launch-choice
overrides (kernel_src/common/tuning.h)."""

from __future__ import annotations

import re

import pytest
import torch

from .conftest import ROOT, is_dev_build

PUBLIC_OPS = {"rmsnorm", "rmsnorm_residual", "adaln_rmsnorm", "gated_residual", "gated_residual_rmsnorm",
              "residual_tanh_gated_rmsnorm", "modulated_rmsnorm", "layernorm", "adaln_layernorm",
              "gated_residual_layernorm", "gelu_tanh", "geglu", "swiglu", "head_gate",
              "apply_rotary_emb", "qk_rmsnorm_rope", "rope_3d", "rope_1d", "pixel_norm", "inplace_add",
              "quantize_fp8", "gelu_tanh_fp8", "adaln_rmsnorm_fp8", "gated_residual_rmsnorm_fp8", "gated_residual_fp8",
              "adaln_layernorm_fp8", "gated_residual_layernorm_fp8"}
DEV_OPS = {"rmsnorm_path", "fused_norm_path", "layernorm_path", "activation_path", "rope_path", "rope_axes_path",
           "qk_rmsnorm_rope_path", "pixel_norm_path", "inplace_add_path", "set_tuning", "tuning_knobs"}


FAMILIES = {"rmsnorm", "fused_norm", "layernorm", "activation", "rope", "rope_axes", "qk_rmsnorm_rope", "vae", "fp8"}


def registered(kernel) -> set:
    """The registered op names, less the functional ops autograd uses (`<op>_fwd` / `<op>_bwd` of a
    differentiable public op, `<family>_bwd` for a family's shared backward, `<family>_fn` for a
    family's one functional op that is its own backward)."""
    prefix = kernel.add_op_namespace_prefix("")
    names = {n[len(prefix):] for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix)}
    pairs = {n for n in names if re.fullmatch(r"\w+_(fwd|bwd|fn)", n)}
    stems = {n.rsplit("_", 1)[0] for n in pairs}
    assert stems <= (set(kernel.DIFFERENTIABLE) | FAMILIES), f"autograd ops of no differentiable op: {stems}"
    return names - pairs


def test_every_registered_op_is_a_public_function_of_that_name(kernel):
    assert PUBLIC_OPS <= set(kernel.__all__)
    assert registered(kernel) - DEV_OPS == PUBLIC_OPS


def test_a_release_build_registers_no_probe_and_no_tuning_op(kernel):
    if is_dev_build(kernel):
        pytest.skip("this is the development build")
    assert registered(kernel) == PUBLIC_OPS


def test_a_development_build_adds_a_path_probe_per_family_and_the_tuning_ops(dev_kernel):
    assert registered(dev_kernel) == PUBLIC_OPS | DEV_OPS


def test_tuning_knobs_are_the_ones_tuning_h_declares(dev_kernel):
    header = (ROOT / "kernel_src" / "common" / "tuning.h").read_text()
    declared = re.search(r"kKnobNames\[\] = \{(.*?)\};", header, re.S).group(1)
    assert list(dev_kernel.ops.tuning_knobs()) == re.findall(r'"([a-z_.]+)"', declared)


def test_set_tuning_refuses_an_unknown_knob_and_lists_the_known_ones(dev_kernel):
    with pytest.raises(RuntimeError, match=r"unknown knob 'fused_norm\.tpr'; knobs: dependent_launch, "):
        dev_kernel.ops.set_tuning("fused_norm.tpr", 1)
    with pytest.raises(RuntimeError, match="must be >= 0, or -1 to clear"):
        dev_kernel.ops.set_tuning("dependent_launch", -2)
    dev_kernel.ops.set_tuning("dependent_launch", -1)  # clearing an unset knob is fine
