"""Numeric helpers the references' users share: the distance of two tensors in
units in the last place, and every finite value of a 2-byte float type."""

from __future__ import annotations

import torch


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise distance in units in the last place for same-dtype floats."""
    assert a.dtype == b.dtype
    int_t = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[a.dtype]

    def ordered(t):
        i = t.contiguous().view(int_t).long()
        sign_bit = 1 << (torch.finfo(t.dtype).bits - 1)
        return torch.where(i < 0, -(i + sign_bit), i)

    return (ordered(a) - ordered(b)).abs()


def every_finite_value(dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    """Every finite value of a 2-byte dtype (bf16, fp16), +0 and -0 included, in bit-pattern order."""
    bits = torch.arange(-2**15, 2**15, dtype=torch.int32, device=device).to(torch.int16)
    values = bits.view(dtype)
    return values[torch.isfinite(values)]
