"""activation's references: the float64 GELU-tanh and head-gate formulas, and
the eager code the activation ops replace (F.gelu, the gated GEGLU / SwiGLU
products over the two halves of the last dim, F.linear then F.gelu, LTX-2's
per-head sigmoid gate)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def gelu_tanh64(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation, in float64."""
    x = x.double()
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_tanh_eager(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def geglu_eager(x: torch.Tensor) -> torch.Tensor:
    """diffusers' GEGLU on an input already projected: GELU-tanh of the first half times the second."""
    a, b = x.chunk(2, dim=-1)
    return F.gelu(a, approximate="tanh") * b


def swiglu_eager(x: torch.Tensor) -> torch.Tensor:
    """SiLU of the first half times the second."""
    a, b = x.chunk(2, dim=-1)
    return F.silu(a) * b


def linear_gelu_eager(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The pair `linear_gelu` fuses: F.linear, then F.gelu (tanh)."""
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


def _per_head(x: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
    """x [..., H * D] times gates [..., H], each gate over its head's D channels."""
    heads = gates.shape[-1]
    return (x.unflatten(-1, (heads, x.shape[-1] // heads)) * gates.unsqueeze(-1)).flatten(-2)


def head_gate64(x: torch.Tensor, logits: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
    """The head gate in float64: x [..., H * D] * scale * sigmoid(logits [..., H]), per head."""
    return _per_head(x.double(), scale * torch.sigmoid(logits.double()))


def head_gate_eager(x: torch.Tensor, logits: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
    """diffusers 0.42's LTX2AudioVideoAttnProcessor after attention, in the tensors' dtype:
    ``hidden_states.unflatten(2, (heads, -1)) * (2.0 * torch.sigmoid(gate_logits)).unsqueeze(-1)``,
    flattened back (any leading dims here)."""
    return _per_head(x, scale * torch.sigmoid(logits))
