"""Back-to-back kernels that each read what the one before wrote: the check behind every
programmatic-dependent-launch test (a dependent kernel must wait before touching memory)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch


def residual_chain(steps, x: torch.Tensor, y: torch.Tensor) -> Callable[[bool], Sequence[torch.Tensor]]:
    """A `chain(sync)` for :func:`assert_chain_sees_each_output` over row ops that carry a
    residual stream: each step maps `(h, n)` (the residual, the last output) to `(n, h)`."""
    def chain(sync):
        h, n = x, y
        for step in steps:
            n, h = step(h, n)
            if sync:
                torch.cuda.synchronize()
        return n, h

    return chain


def assert_chain_sees_each_output(chain: Callable[[bool], Sequence[torch.Tensor]]) -> None:
    """`chain(sync)` runs a chain of ops, each reading the previous op's output, synchronising
    after each op when `sync`, and returns the tensors to compare. Run one synchronised op at a
    time it gives the expected values; run back to back (in the test's `launch_mode`), eagerly and
    replayed from a CUDA graph (its outputs poisoned before the replay), it must give them bitwise."""
    expected = chain(True)
    assert all(torch.equal(a, b) for a, b in zip(chain(False), expected, strict=True))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain(False)
    for t in captured:
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(captured, expected, strict=True))
