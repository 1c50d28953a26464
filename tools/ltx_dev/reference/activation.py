"""activation's references: the float64 GELU-tanh formula, and the eager code
the activation ops replace (F.gelu, the gated GEGLU / SwiGLU products over the
two halves of the last dim, F.linear then F.gelu)."""

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
