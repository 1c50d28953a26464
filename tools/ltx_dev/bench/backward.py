"""Backward benchmark rows for the rotary families (issue 36): each
implementation's forward runs outside the timing, then only
`torch.autograd.grad(outputs, leaves, upstream)` is timed (as bench_rmsnorm's
backward rows), under the harness's `measure`."""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

import torch
import torch._functorch.config  # not imported by `import torch` alone

from ltx_dev.bench.harness import measure

# forward(*leaves) -> output tensor or tuple of them
Forward = Callable[..., object]


def measure_backward(rows: list, ceiling: float, op: str, shape, forwards: Dict[str, Forward],
                     make_leaves: Callable[[], Sequence[torch.Tensor]], nbytes: int,
                     grad_leaves: Optional[int] = None, label: str = "") -> None:
    """One "<op> backward<label>" row per implementation: leaves from `make_leaves()` (all requiring
    grad, or only the first `grad_leaves`: the grads timed are theirs), an upstream grad like each
    output, the forward outside the timing."""
    for name, forward in forwards.items():
        def make_args(i, forward=forward):
            made = make_leaves()
            wanted = len(made) if grad_leaves is None else grad_leaves
            leaves = [t.detach().requires_grad_(j < wanted) for j, t in enumerate(made)]
            out = forward(*leaves)
            outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
            return outs, tuple(leaves[:wanted]), tuple(torch.randn_like(o) for o in outs)

        # The timing calls each backward many times on one graph (retain_graph=True); a compiled
        # backward with donated buffers refuses that (Wan's shape raised "non-empty donated buffers"
        # there), so compile without them: the buffers stay alive, as eager autograd keeps its own.
        with torch._functorch.config.patch(donated_buffer=False):
            measure(rows, ceiling, f"{op} backward{label}", shape,
                    {name: lambda outs, leaves, dys: torch.autograd.grad(outs, leaves, dys, retain_graph=True)},
                    make_args, nbytes)


def liger_rope():
    """Liger's rotate-half RoPE (q [B, H, S, D], k, cos/sin [1, S, D]; newer versions return
    (q, k, cos, sin)), or None where Liger is missing."""
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
    except Exception as e:  # noqa: BLE001 - report and go on without it
        print(f"Liger unavailable: {e!r}", flush=True)
        return None
    return LigerRopeFunction.apply
