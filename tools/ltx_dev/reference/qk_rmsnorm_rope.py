"""qk_rmsnorm_rope's references: the eager chains the op replaces. LTX-Video:
torch.nn.RMSNorm over all heads of q and k, then its interleaved RoPE with
[B, S, D] tables. Flux (per head): diffusers' RMSNorm over each head of 128,
then the interleaved RoPE with [S, head_dim] tables, on the [B, H, S, D] view.
Wan: torch.nn.RMSNorm over all heads, then its processor's rotation of each pair in
float32 with one head's [1, S, 1, head_dim] tables, cast back once."""

from __future__ import annotations

import torch

from .rmsnorm import diffusers_rms_norm
from .rope import interleaved_rotary


def ltx_qk_eager(q, k, norm_q, norm_k, cos, sin, apply_rotary_emb):
    """LTX's attention processor: `apply_rotary_emb(norm_q(q))` and the same for k."""
    return apply_rotary_emb(norm_q(q), (cos, sin)), apply_rotary_emb(norm_k(k), (cos, sin))


def flux_qk_eager(q, k, q_weight, k_weight, cos, sin, eps=1e-6):
    """Flux's per-head q/k norm and RoPE on the [B, H, S, D] tensors its processor holds."""
    return (interleaved_rotary(diffusers_rms_norm(q, q_weight, eps), cos, sin),
            interleaved_rotary(diffusers_rms_norm(k, k_weight, eps), cos, sin))


def wan_qk_eager(q, k, norm_q, norm_k, cos, sin, heads):
    """Wan's self-attention processor on [B, S, D] q and k: the norms over all heads, then per head the
    pairs (x1, x2) = channels (2i, 2i + 1) rotated as x1 * cos - x2 * sin, x1 * sin + x2 * cos with the
    [1, S, 1, head_dim] float32 tables' even (cos) and odd (sin) columns, in float32, cast once."""
    def rotate(x):
        x = x.unflatten(2, (heads, -1))
        x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
        c, s = cos[..., 0::2], sin[..., 1::2]
        return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), -1).flatten(-2).type_as(x)

    return rotate(norm_q(q)), rotate(norm_k(k))
