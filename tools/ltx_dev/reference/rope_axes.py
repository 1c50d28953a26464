"""Float64 references for `rope_3d` / `rope_1d` (written from the formula in
their docstrings), and Wan 2.1's own two formulations to check them against:
the original complex multiply (`wan/modules/model.py`: `rope_params`,
`rope_apply`) and diffusers' `WanAttnProcessor` rotation with
`WanRotaryPosEmbed` tables."""

from __future__ import annotations

import torch

F64 = torch.float64


def rope_3d_split(head_dim: int) -> tuple[int, int, int]:
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


def axis_freqs(channels: int, theta: float, device=None) -> torch.Tensor:
    """theta ** (-2j / channels) for the channels // 2 pairs of one part, float64."""
    j = torch.arange(channels // 2, dtype=F64, device=device)
    return float(theta) ** (-2.0 * j / channels)


def angles_3d(num_frames: int, height: int, width: int, head_dim: int, theta: float = 10000.0,
              device=None) -> torch.Tensor:
    """[F*H*W, head_dim // 2] float64 angles, tokens frame-major, then row, then column."""
    axes = [torch.arange(n, dtype=F64, device=device) for n in (num_frames, height, width)]
    pos = [g.flatten() for g in torch.meshgrid(*axes, indexing="ij")]
    parts = [p[:, None] * axis_freqs(d, theta, device)[None, :] for p, d in zip(pos, rope_3d_split(head_dim))]
    return torch.cat(parts, dim=1)


def angles_1d(seq: int, head_dim: int, theta: float = 10000.0, device=None) -> torch.Tensor:
    """[seq, head_dim // 2] float64 angles: position s times theta ** (-2j / head_dim)."""
    return torch.arange(seq, dtype=F64, device=device)[:, None] * axis_freqs(head_dim, theta, device)[None, :]


def rotate_f64(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """x [B, S, H, D] (any dtype) rotated by angles [S, D/2] on interleaved pairs, float64."""
    x0, x1 = x.to(F64).unflatten(-1, (-1, 2)).unbind(-1)
    c, s = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    return torch.stack([x0 * c - x1 * s, x1 * c + x0 * s], dim=-1).flatten(-2)


def rope_3d_f64(query, key, num_frames, height, width, theta=10000.0):
    a = angles_3d(num_frames, height, width, query.shape[-1], theta, query.device)
    return rotate_f64(query, a), rotate_f64(key, a)


def rope_1d_f64(query, key, theta=10000.0):
    a = angles_1d(query.shape[1], query.shape[-1], theta, query.device)
    return rotate_f64(query, a), rotate_f64(key, a)


# --- Wan 2.1, for cross-checking the references above --------------------------

def wan_original_rope(x: torch.Tensor, num_frames: int, height: int, width: int, theta: float = 10000.0):
    """Wan2.1 `rope_apply` with its `rope_params` table for one sample grid, written as
    the original does it: a complex128 multiply on [B, S, H, D/2] pairs. Returns float64."""
    d = x.shape[-1]

    def rope_params(max_seq_len, dim):
        freqs = torch.outer(torch.arange(max_seq_len, dtype=F64),
                            1.0 / torch.pow(theta, torch.arange(0, dim, 2, dtype=F64).div(dim)))
        return torch.polar(torch.ones_like(freqs), freqs)

    freqs = torch.cat([rope_params(1024, d - 4 * (d // 6)), rope_params(1024, 2 * (d // 6)),
                       rope_params(1024, 2 * (d // 6))], dim=1).to(x.device)
    c = d // 2
    freqs = freqs.split([c - 2 * (c // 3), c // 3, c // 3], dim=1)
    f, h, w = num_frames, height, width
    seq = f * h * w
    freqs_i = torch.cat([freqs[0][:f].view(f, 1, 1, -1).expand(f, h, w, -1),
                         freqs[1][:h].view(1, h, 1, -1).expand(f, h, w, -1),
                         freqs[2][:w].view(1, 1, w, -1).expand(f, h, w, -1)], dim=-1).reshape(seq, 1, -1)
    xc = torch.view_as_complex(x.to(F64).reshape(x.shape[0], seq, x.shape[2], -1, 2))
    return torch.view_as_real(xc * freqs_i).flatten(3)


def diffusers_wan_rotary_apply(hidden_states, freqs_cos, freqs_sin):
    """The `apply_rotary_emb` nested in diffusers' `WanAttnProcessor.__call__`
    (diffusers 0.42), written out: float32 tables, products and sums in float32,
    stored into a tensor of the input's dtype."""
    x1, x2 = hidden_states.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(hidden_states)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(hidden_states)


def diffusers_wan_tables(head_dim: int, num_frames: int, height: int, width: int, theta: float = 10000.0,
                         device=None):
    """(cos, sin) float32 [1, F*H*W, 1, head_dim] from diffusers' `WanRotaryPosEmbed`
    (patch size 1, so the latent grid is the token grid). Raises ImportError when diffusers,
    or one of its own dependencies, cannot be imported."""
    try:
        from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed
    except Exception as e:  # noqa: BLE001 - any import-time failure means "not available"
        raise ImportError(repr(e)) from e

    module = WanRotaryPosEmbed(head_dim, (1, 1, 1), 1024, theta).to(device)
    return module(torch.empty(1, 1, num_frames, height, width, device=device))
