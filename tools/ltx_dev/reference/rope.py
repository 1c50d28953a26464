"""rope's references: diffusers' LTX-Video `apply_rotary_emb` (interleaved
pairs, float32 products, one cast), and the pair partners every rotation
formula takes."""

from __future__ import annotations

import torch


def rotate_pairs(n: torch.Tensor, rotation: str) -> torch.Tensor:
    """The partner of every element with its sign: (-b, a) per pair, interleaved
    (2i, 2i+1) or rotate-half (i, i + d/2) over the last dim."""
    if rotation == "interleaved":
        a, b = n.unflatten(-1, (-1, 2)).unbind(-1)
        return torch.stack([-b, a], dim=-1).flatten(-2)
    a, b = n.unflatten(-1, (2, -1)).unbind(-2)
    return torch.cat([-b, a], dim=-1)


def interleaved_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + partner * sin on interleaved pairs, products in float32, one cast to x's dtype:
    diffusers' LTX-Video and Flux (`use_real_unbind_dim=-1`) rotations."""
    return (x.float() * cos + rotate_pairs(x, "interleaved").float() * sin).to(x.dtype)


def ltx_apply_rotary_emb(x: torch.Tensor, freqs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """diffusers' `transformer_ltx.apply_rotary_emb` (0.42) written out, for machines without
    diffusers: x [B, S, D], freqs = (cos, sin) float32 [B, S, D]."""
    return interleaved_rotary(x, *freqs)


def diffusers_ltx_apply_rotary_emb():
    """diffusers' own `apply_rotary_emb` of LTX-Video where diffusers imports, else the copy above."""
    try:
        from diffusers.models.transformers.transformer_ltx import apply_rotary_emb
    except ImportError:
        return ltx_apply_rotary_emb
    return apply_rotary_emb
