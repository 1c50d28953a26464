"""Helpers the backward GPU tests of every family share (issue 36): grads of
an output, relative L2 error, NaN-filled allocations, the kernels a call
launches, and a CUDA-graph capture of forward + backward replayed on new inputs."""

from __future__ import annotations

import contextlib
from typing import Callable, Sequence

import torch


def grads(outputs, upstream, *tensors):
    """torch.autograd.grad of `outputs` (a tensor or a tuple) with `upstream` for the tensors that are not None."""
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    upstream = upstream if isinstance(upstream, (tuple, list)) else (upstream,)
    return torch.autograd.grad(outputs, [t for t in tensors if t is not None], upstream)


def rel_l2(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def launched_kernels(fn: Callable[[], object]) -> list:
    """The names of the GPU kernels (and memsets) fn() launches."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events()]


@contextlib.contextmanager
def nan_filled_allocations():
    """Fresh allocations (torch.empty, and the bindings' at::empty: outputs and workspaces) come
    filled with NaN: an element a kernel leaves unwritten shows."""
    before = torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.utils.deterministic.fill_uninitialized_memory = before[1]


def graph_replays_training_step(step: Callable[[], None], leaves: Sequence[torch.Tensor],
                                refill: Callable[[], None]) -> None:
    """Capture `step` (forward + backward into the leaves' .grad) in a CUDA graph, refill the
    inputs in place, replay, and check the replayed grads equal an eager step's on the new inputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch.cuda.graphs asks
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    for t in leaves:
        t.grad = None
    with torch.cuda.graph(graph):
        step()
    with torch.no_grad():
        refill()
    graph.replay()
    torch.cuda.synchronize()
    replayed = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    step()
    for t, r in zip(leaves, replayed):
        assert torch.equal(t.grad, r)
