"""RoPE application without a GPU: errors naming the argument and the fake
implementation's shape (meta tensors, as torch.compile traces them)."""

from __future__ import annotations

import pytest
import torch


def test_apply_rotary_emb_on_cpu_tensors_names_the_argument(kernel):
    cos, sin = kernel.ltx_rope_cos_sin(1, 2, 4, None, 64, batch_size=2)
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="`x` must be a CUDA tensor"):
        kernel.apply_rotary_emb(x, cos, sin)


def test_apply_rotary_emb_fake_gives_the_output_shape(kernel):
    x = torch.empty(2, 8, 64, dtype=torch.bfloat16, device="meta")
    t = torch.empty(1, 8, 64, device="meta")
    assert kernel.apply_rotary_emb(x, t, t).shape == (2, 8, 64)
