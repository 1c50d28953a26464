"""Robustness sweep on the GPU (issue 7, items 2-6), over the registry of every
exported op (ltx_dev/registry.py). Skipped without CUDA.

- Random problems (hypothesis): shapes with 0, 1, odd and prime sizes, widths just
  below, at and above a 16-byte word and past the vectorised limits, every
  broadcast form, storage offsets that break 16-byte alignment, padded, strided,
  transposed and expanded views, aliasing (in place, overlapping operands), every
  dtype; each checked against a float64 reference, and no byte outside what the op
  may write (output padding, read-only inputs) may change.
  LTX_ROBUSTNESS_EXAMPLES examples per op (default 500).
- A rejected call (device, dtype, shape, stride, value) writes nothing and the next
  valid call is right, for every rejection of every op.
- CUDA graphs: captured and replayed, the result equals eager, new inputs written
  into the captured tensors are read, and nothing in the op synchronises with the
  host (torch.cuda.set_sync_debug_mode("error")).
- Streams: the op runs on the caller's current stream, ordered by events alone.
- Devices: on cuda:1 while cuda:0 is current the result is right and lands on
  cuda:1; mixing devices is refused (skipped with fewer than two GPUs).
- Inputs of more than 2^31 elements (2^32 for rmsnorm and inplace_add) index
  correctly, on both paths; rows past the 2^31 and 2^32 boundaries are checked
  (needs ~24 GiB free).
"""

from __future__ import annotations

import contextlib
import os
import re

import pytest
import torch

from ltx_dev.registry import BF16, OPS, Source, assert_matches

from .conftest import cuda
from .sweep_support import ids, random_problems_test

pytestmark = cuda

EXAMPLES = int(os.environ.get("LTX_ROBUSTNESS_EXAMPLES", "500"))
SLEEP_CYCLES = 50_000_000  # ~25 ms of GPU time: long enough for a wrong-stream launch to race
BIG_FREE_BYTES = 24 << 30
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


def raises(error, message):
    return pytest.raises(error, match=re.escape(message) if message else None)


@contextlib.contextmanager
def no_host_sync():
    """torch raises on any synchronising call inside (set_sync_debug_mode("error"))."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def clones(outputs):
    return [o.clone() for o in outputs]


def assert_same(got, expected, spec, references, dtype, what):
    """Bitwise equal for deterministic ops; cuBLAS (linear_gelu) may pick another
    algorithm between calls, so there both must match the reference instead."""
    if spec.deterministic:
        for i, (g, e) in enumerate(zip(got, expected)):
            assert torch.equal(g, e), f"{what}: output {i} differs from eager"
    else:
        assert_matches(got, references, spec.tolerance[dtype], what=what)
        assert_matches(expected, references, spec.tolerance[dtype], what=what)


# --- random problems against float64 ----------------------------------------------------------------

def check_random_problem(kernel, spec, pick, dtype, seed):
    problem = spec.random_problem(pick)
    args, arena = spec.build(problem, dtype, Source(seed, "cuda"))
    expected = spec.reference(args)  # first: in-place ops overwrite their inputs
    arena.snapshot()
    outputs = spec.call(kernel, args)
    assert_matches(outputs, expected, spec.tolerance[dtype], args[spec.main].device, f"{spec.name} {problem}")
    arena.assert_untouched()


test_random_problems_match_float64_and_write_only_their_outputs = random_problems_test(OPS, EXAMPLES,
                                                                                      check_random_problem)


# --- errors never poison the context --------------------------------------------------------------

REJECTED = [(spec, bad) for spec in OPS for bad in spec.errors]


@pytest.mark.parametrize("spec, bad", REJECTED, ids=[f"{s.name}-{b.label}" for s, b in REJECTED])
def test_a_rejected_call_writes_nothing_and_the_next_call_is_right(kernel, spec, bad):
    args, arena = spec.build(spec.canonical("small", "vector"), BF16, Source(7, "cuda"))
    expected = spec.reference(args)
    arena.snapshot()
    with raises(bad.error, bad.message):
        bad.run(kernel, spec, args)
    torch.cuda.synchronize()  # an asynchronous launch error would surface here
    arena.assert_untouched(writes_allowed=False)
    assert_matches(spec.call(kernel, args), expected, spec.tolerance[BF16], what=spec.name)
    torch.cuda.synchronize()


# --- CUDA graphs --------------------------------------------------------------------------------------

# the fp8 ops have one path: no fallback problem
GRAPHED = [(spec, path) for path in ("vector", "fallback") for spec in OPS
           if spec.canonical("medium", path) is not None]


@pytest.mark.parametrize("spec, path", GRAPHED, ids=[f"{s.name}-{p}" for s, p in GRAPHED])
def test_cuda_graph_replay_matches_eager_and_reads_new_inputs_without_host_syncs(kernel, spec, path):
    problem = spec.canonical("medium", path)
    args, arena = spec.build(problem, BF16, Source(1, "cuda"))
    other_args, other = spec.build(problem, BF16, Source(2, "cuda"))  # the same tensors, other values
    references_a, references_b = spec.reference(args), spec.reference(other_args)
    arena.snapshot()
    with no_host_sync():
        eager_a = clones(spec.call(kernel, args))

    arena.restore()  # warm up on a side stream, as torch.cuda.graph asks
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        spec.call(kernel, args)
    torch.cuda.current_stream().wait_stream(side)
    arena.restore()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with no_host_sync():
            captured = spec.call(kernel, args)
    graph.replay()
    assert_same(clones(captured), eager_a, spec, references_a, BF16, f"{spec.name} replay")

    arena.load(other)  # new inputs, written into the captured tensors
    graph.replay()
    graph_b = clones(captured)
    arena.load(other)
    with no_host_sync():
        eager_b = clones(spec.call(kernel, args))
    assert_same(graph_b, eager_b, spec, references_b, BF16, f"{spec.name} replay on new inputs")
    assert any(not torch.equal(a, b) for a, b in zip(graph_b, eager_a)), "the replay did not read the new inputs"


# --- streams and devices ------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", OPS, ids=ids(OPS))
def test_ops_run_on_the_callers_stream_ordered_by_events_alone(kernel, spec):
    """The inputs are written on `producer` after a long sleep and the outputs read
    on `consumer` after an event: an op on any other stream would read the old
    inputs or be read before it ran."""
    args, arena = spec.build(spec.canonical("medium", "vector"), BF16, Source(3, "cuda"))
    expected = spec.reference(args)
    arena.snapshot()
    arena.scramble()
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    producer.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(producer):
        torch.cuda._sleep(SLEEP_CYCLES)
        arena.restore()
        outputs = spec.call(kernel, args)
        done = torch.cuda.Event()
        done.record()
    consumer.wait_event(done)
    with torch.cuda.stream(consumer):
        results = clones(outputs)
    torch.cuda.synchronize()
    assert_matches(results, expected, spec.tolerance[BF16], what=spec.name)


@two_gpus
@pytest.mark.parametrize("spec", OPS, ids=ids(OPS))
def test_ops_on_the_second_gpu_while_the_first_is_current(kernel, spec):
    second = torch.device("cuda", 1)
    with torch.cuda.device(0):
        args, arena = spec.build(spec.canonical("medium", "vector"), BF16, Source(4, second))
        expected = spec.reference(args)
        arena.snapshot()
        outputs = spec.call(kernel, args)
        assert torch.cuda.current_device() == 0, "the op changed the current device"
        assert_matches(outputs, expected, spec.tolerance[BF16], second, spec.name)
        arena.assert_untouched()
        torch.cuda.synchronize(second)


@two_gpus
@pytest.mark.parametrize("spec", OPS, ids=ids(OPS))
def test_tensors_on_two_gpus_are_refused_and_the_next_call_is_right(kernel, spec):
    second = torch.device("cuda", 1)
    args, arena = spec.build(spec.canonical("small", "vector"), BF16, Source(5, second))
    expected = spec.reference(args)
    moves = [bad for bad in spec.errors if bad.move and any(
        isinstance(v, torch.Tensor) for name, v in args.items() if name != bad.arg)]
    if not moves:
        pytest.skip(f"{spec.name} takes a single tensor: moving it is not a mix of devices")
    for bad in moves:
        with pytest.raises(RuntimeError):
            bad.run(kernel, spec, args, device="cuda:0")
    assert_matches(spec.call(kernel, args), expected, spec.tolerance[BF16], second, spec.name)


# --- more than 2^31 elements --------------------------------------------------------------------------

def sample_index(extent: int, per_index: int) -> torch.Tensor:
    """Indices along the sampled axis: both ends, the middle, and each side of the
    entries where the main input's element index passes 2^31 and 2^32."""
    picks = {0, 1, extent // 2, extent - 2, extent - 1}
    for boundary in (1 << 31, 1 << 32):
        b = boundary // per_index
        picks |= {b - 1, b, b + 1}
    return torch.tensor(sorted(i for i in picks if 0 <= i < extent), device="cuda")


BIG = [(spec, path) for spec in OPS for path in ("vector", "fallback") if spec.canonical("big", path) is not None]


@pytest.mark.parametrize("spec, path", BIG, ids=[f"{s.name}-{p}" for s, p in BIG])
def test_inputs_of_more_than_2_pow_31_elements_index_correctly(kernel, spec, path):
    torch.cuda.empty_cache()
    if torch.cuda.mem_get_info()[0] < BIG_FREE_BYTES:
        pytest.skip("needs 24 GiB of free GPU memory")
    try:
        args, _ = spec.build(spec.canonical("big", path), BF16, Source(11, "cuda"), sentinel=False)
        main, axis = args[spec.main], spec.big_axis
        assert main.numel() > 2**31
        index = sample_index(main.shape[axis], main.stride(axis))
        expected = spec.expected_at(args, axis, index)  # first: in-place ops overwrite their inputs
        outputs = spec.call(kernel, args)
        got = [o.index_select(axis, index) for o in outputs]
        assert_matches(got, expected, spec.tolerance[BF16], what=f"{spec.name} at {index.tolist()}")
    finally:
        args = outputs = got = main = None
        torch.cuda.empty_cache()
