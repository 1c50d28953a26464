"""qk_rmsnorm_rope's references: the eager chains the op replaces. LTX-Video:
torch.nn.RMSNorm over all heads of q and k, then its interleaved RoPE with
[B, S, D] tables. Flux (per head): diffusers' RMSNorm over each head of 128,
then the interleaved RoPE with [S, head_dim] tables, on the [B, H, S, D] view."""

from __future__ import annotations

from .rmsnorm import diffusers_rms_norm
from .rope import interleaved_rotary


def ltx_qk_eager(q, k, norm_q, norm_k, cos, sin, apply_rotary_emb):
    """LTX's attention processor: `apply_rotary_emb(norm_q(q))` and the same for k."""
    return apply_rotary_emb(norm_q(q), (cos, sin)), apply_rotary_emb(norm_k(k), (cos, sin))


def flux_qk_eager(q, k, q_weight, k_weight, cos, sin, eps=1e-6):
    """Flux's per-head q/k norm and RoPE on the [B, H, S, D] tensors its processor holds."""
    return (interleaved_rotary(diffusers_rms_norm(q, q_weight, eps), cos, sin),
            interleaved_rotary(diffusers_rms_norm(k, k_weight, eps), cos, sin))
