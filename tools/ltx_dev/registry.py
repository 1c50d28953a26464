"""Every op the package exports, described once for the robustness sweeps
(tests/test_robustness_gpu.py, tests/test_robustness_cpu.py), the launch-overhead
test and the compute-sanitizer driver (`ltx-dev sanitize`).

An `OpSpec` says how to draw a random valid problem (sizes, options, memory
layouts), names a few fixed ones ("small", "medium", "ltx" and "big", each on
the vectorised or the fallback path), builds the call's arguments from a
problem in any memory layout, makes the call, gives its float64 reference with
a scale to measure the error against, and lists calls that must be rejected.
Adding an op means adding one OpSpec to OPS.

Nothing here needs a GPU or hypothesis: problems are drawn through a `Pick`
(hypothesis' `data.draw` in the tests, `random.Random` elsewhere) and tensors
are built by an `Arena` on any device, fake (FakeTensorMode) CUDA tensors
included.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .reference.activation import gelu_tanh64, head_gate64
from .reference.layernorm import layer_norm_f64
from .reference.rmsnorm import rms_norm_f64
from .reference.rope import rotate_pairs
from .reference.rope_axes import axis_freqs, rope_1d_f64, rope_3d_f64, rope_3d_split, rotate_f64
from .reference.vae import pixel_norm_f64

BF16, F16, F32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
ALL_DTYPES = (BF16, F16, F32)
Args = Dict[str, Any]

# Allowed |out - ref| / scale, by the dtype the op computes in: 8 unit roundoffs
# of a half type (a chain of up to four roundings), 1e-4 in float32 (float32
# sums over rows of up to 70k elements). Loose on purpose: these sweeps hunt
# indexing, layout and aliasing bugs, which are O(1) errors; the per-op tests
# check the roundings bit for bit.
TOLERANCE = {BF16: 2.0 ** -5, F16: 2.0 ** -8, F32: 1e-4}

# Magnitudes of drawn values: |v| in [lo, hi] with a random sign, so that no
# half-precision intermediate underflows (pixel_norm's "original" rounding
# squares the input in the input dtype).
VALUES = (0.25, 2.5)
WEIGHTS = (0.5, 1.5)
MODULATION = (0.05, 0.6)

PRIMES = (2, 3, 5, 7, 11, 13, 17, 31, 61, 97, 127, 257, 509, 1021, 2039, 4093)
EPS = (1e-6, 1e-5, 0.1)
ELEMENT_BUDGET = 1 << 17  # elements per drawn tensor, so one example stays a few ms


# --- drawing problems -------------------------------------------------------------------

class Pick:
    """The three choices a problem is drawn from. Subclasses draw them from
    hypothesis (tests) or from a seeded random.Random (here)."""

    def integer(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def choice(self, options: Sequence[Any]) -> Any:
        raise NotImplementedError

    def boolean(self) -> bool:
        return self.choice((False, True))


class DrawPick(Pick):
    """Choices drawn by hypothesis from `data` (st.data()), so failures shrink."""

    def __init__(self, data):
        from hypothesis import strategies as st

        self.data, self.st = data, st

    def integer(self, lo: int, hi: int) -> int:
        return self.data.draw(self.st.integers(lo, hi))

    def choice(self, options: Sequence[Any]) -> Any:
        return self.data.draw(self.st.sampled_from(tuple(options)))


class RandomPick(Pick):
    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, options: Sequence[Any]) -> Any:
        return options[self.rng.randrange(len(options))]


def width(pick: Pick, large: Sequence[int] = (16376, 16384, 16392, 20011)) -> int:
    """A row width: tiny (1 and the sizes around one 16-byte word), just below,
    at and above multiples of a word, primes, model widths, or large (around the
    fused kernels' vectorised limit of 16384 half elements)."""
    kind = pick.choice(("tiny", "word", "prime", "model", "large"))
    if kind == "tiny":
        return pick.integer(1, 40)
    if kind == "word":
        return max(1, 8 * pick.integer(1, 64) + pick.choice((0, -1, 1, 4)))
    if kind == "prime":
        return pick.choice(PRIMES)
    if kind == "model":
        return pick.choice((1000, 1536, 2048, 3072, 4096))
    return pick.choice(large)


def count(pick: Pick, hi: int = 70, zero: bool = True) -> int:
    """A row, batch or sequence count: mostly small, sometimes 1, sometimes 0."""
    kind = pick.choice(("small", "one", "medium", "zero") if zero else ("small", "one", "medium"))
    if kind == "one":
        return 1
    if kind == "zero":
        return 0
    small_hi = min(9, hi)
    return pick.integer(min(2, small_hi), small_hi) if kind == "small" or hi <= small_hi else pick.integer(10, hi)


def fit(dims: Sequence[int], per_element: int, budget: int = ELEMENT_BUDGET) -> List[int]:
    """Halve the largest of `dims` until prod(dims) * per_element fits the budget."""
    dims = list(dims)
    while dims and max(dims) > 1 and math.prod(dims) * max(per_element, 1) > budget:
        i = max(range(len(dims)), key=lambda j: dims[j])
        dims[i] //= 2
    return dims


# Memory layouts (see Arena.storage). A layout is (kind, parameter).
CONTIGUOUS = ("contiguous", 0)
ANY_LAYOUT = ("contiguous", "offset", "front_pad", "outer_gap", "transposed", "step2")
LAST_DIM_CONTIGUOUS = ("contiguous", "offset", "front_pad", "outer_gap", "transposed")
DENSE = ("contiguous", "offset")
BROADCAST = ANY_LAYOUT + ("expanded",)


def layout(pick: Pick, kinds: Sequence[str]) -> Tuple[str, int]:
    kind = pick.choice(kinds)
    param = {"offset": (1, 2, 4, 8), "front_pad": (1, 3, 8, 16), "outer_gap": (1, 2, 8)}.get(kind)
    return (kind, pick.choice(param)) if param else (kind, 0)


# --- building tensors ---------------------------------------------------------------------

class Source:
    """Values for the tensors of a call: sign * U(lo, hi), from a seeded generator
    on the target device. `shape_only` leaves them unset (fake tensors)."""

    def __init__(self, seed: int = 0, device: Any = "cuda", *, shape_only: bool = False):
        self.device = torch.device(device)
        self.shape_only = shape_only
        self.generator = None if shape_only else torch.Generator(device=self.device).manual_seed(seed)

    def fill(self, t: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
        if self.shape_only or t.numel() == 0:
            return t
        t.uniform_(-(hi - lo), hi - lo, generator=self.generator)
        # add lo * sign(t), with +lo where the draw is exactly 0 (low-precision uniform_ draws
        # give some: torch 2.11's bf16 did); a flat tensor in chunks, so a 4 GiB input needs
        # no 4 GiB temporary
        parts = t.view(-1).split(1 << 26) if t.is_contiguous() else (t,)
        for part in parts:
            part.add_(torch.where(part < 0, -1.0, 1.0).to(part.dtype), alpha=lo)
        return t

    def angles(self, shape: Sequence[int]) -> torch.Tensor:
        a = torch.empty(tuple(shape), dtype=F32, device=self.device)
        if not self.shape_only and a.numel():
            a.uniform_(0.0, 2 * math.pi, generator=self.generator)
        return a


class Arena:
    """Allocates the tensors of one call, each a view of its own buffer (or of a
    buffer shared with another view), and remembers which elements the op may
    write. With `sentinel`, every buffer starts as NaN, so that an output element
    left unwritten or a write outside the views shows; without it, the memory
    around the views stays uninitialised (for compute-sanitizer's initcheck)."""

    def __init__(self, source: Source, *, sentinel: bool = True):
        self.source = source
        self.sentinel = sentinel
        self.buffers: List[torch.Tensor] = []
        self.writable: List[Optional[torch.Tensor]] = []  # bool masks, None when read-only
        self.saved: List[torch.Tensor] = []

    @property
    def device(self) -> torch.device:
        return self.source.device

    # memory layouts ------------------------------------------------------------------
    @staticmethod
    def storage(shape: Sequence[int], lay: Tuple[str, int]) -> Tuple[Tuple[int, ...], Callable]:
        """(buffer shape, buffer -> view of `shape`) for a layout:
        contiguous; offset (storage offset of k elements: breaks 16-byte alignment
        unless k is a whole word); front_pad (k elements before each innermost row:
        a row stride that is not the width); outer_gap (dim 1 sliced out of a longer
        one: leading dims that do not flatten into rows); transposed (dims 0 and 1
        swapped in memory, rank >= 3); step2 (every second element: a non-contiguous last dim).
        A layout that needs more dims than the tensor has falls back to contiguous."""
        shape = tuple(shape)
        kind, k = lay
        rank = len(shape)
        if kind == "offset":
            n = math.prod(shape)
            return (n + k,), lambda b: b[k:].view(shape)
        if kind == "front_pad" and rank >= 1:
            return (*shape[:-1], shape[-1] + k), lambda b: b[..., k:]
        if kind == "step2" and rank >= 1:
            return (*shape[:-1], 2 * shape[-1]), lambda b: b[..., ::2]
        if kind == "outer_gap" and rank >= 2:
            return (shape[0], shape[1] + k, *shape[2:]), lambda b: b[:, k:]
        if kind == "transposed" and rank >= 3:  # keeps the last dim contiguous (step2 breaks it)
            return (shape[1], shape[0], *shape[2:]), lambda b: b.transpose(0, 1)
        return shape, lambda b: b

    def buffer(self, shape: Sequence[int], dtype: torch.dtype) -> int:
        buf = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        if self.sentinel:
            buf.fill_(float("nan"))
        self.buffers.append(buf)
        self.writable.append(None)
        return len(self.buffers) - 1

    def view(self, index: int, to_view: Callable, writable: bool = False) -> torch.Tensor:
        if writable:
            if self.writable[index] is None:
                self.writable[index] = torch.zeros(self.buffers[index].shape, dtype=torch.bool, device=self.device)
            to_view(self.writable[index]).fill_(True)
        return to_view(self.buffers[index])

    # tensors of a call ------------------------------------------------------------------
    def tensor(self, shape: Sequence[int], dtype: torch.dtype, lay: Tuple[str, int] = CONTIGUOUS, *,
               writable: bool = False, values: Tuple[float, float] = VALUES) -> torch.Tensor:
        """A tensor of `shape` in layout `lay`, filled with drawn values. `expanded`
        stores the first dim of size > 1 (not the last) once and broadcasts it with
        stride 0, so the values repeat along it."""
        shape = tuple(shape)
        if lay[0] == "expanded":
            d = next((i for i in range(len(shape) - 1) if shape[i] > 1), None)
            if d is not None and not writable:
                small = shape[:d] + (1,) + shape[d + 1:]
                return self.tensor(small, dtype, CONTIGUOUS, values=values).expand(shape)
            lay = CONTIGUOUS
        buf_shape, to_view = self.storage(shape, lay)
        t = self.view(self.buffer(buf_shape, dtype), to_view, writable)
        return self.source.fill(t, *values)

    def output(self, shape: Sequence[int], dtype: torch.dtype, lay: Tuple[str, int] = CONTIGUOUS) -> torch.Tensor:
        """An output the op writes: NaN (or uninitialised) until it does."""
        buf_shape, to_view = self.storage(tuple(shape), lay)
        return self.view(self.buffer(buf_shape, dtype), to_view, writable=True)

    def place(self, values: torch.Tensor, lay: Tuple[str, int] = CONTIGUOUS) -> torch.Tensor:
        """A read-only copy of `values` in layout `lay`."""
        if lay[0] == "expanded":
            lay = CONTIGUOUS
        buf_shape, to_view = self.storage(tuple(values.shape), lay)
        t = self.view(self.buffer(buf_shape, values.dtype), to_view)
        if not self.source.shape_only:
            t.copy_(values)
        return t

    def tables(self, shape: Sequence[int], lay: Tuple[str, int]) -> Tuple[torch.Tensor, torch.Tensor]:
        """RoPE tables (cos, sin) of random angles, float32, in layout `lay`
        ("expanded": stored once for the batch, stride 0)."""
        shape = tuple(shape)
        if lay[0] == "expanded" and len(shape) == 3 and shape[0] > 1:
            cos, sin = self.tables((1, *shape[1:]), CONTIGUOUS)
            return cos.expand(shape), sin.expand(shape)
        a = self.source.angles(shape)
        return self.place(a.cos(), lay), self.place(a.sin(), lay)

    # snapshots -----------------------------------------------------------------------------
    def snapshot(self) -> None:
        self.saved = [b.clone() for b in self.buffers]

    def restore(self) -> None:
        """Put back the values of the last snapshot (in-place ops overwrite their inputs)."""
        for b, s in zip(self.buffers, self.saved):
            b.copy_(s)

    def load(self, other: "Arena") -> None:
        """Copy the buffers of `other`, built from the same problem, into these."""
        assert len(self.buffers) == len(other.buffers)
        for b, o in zip(self.buffers, other.buffers):
            b.copy_(o)

    def scramble(self, value: float = 0.75) -> None:
        for b in self.buffers:
            b.fill_(value)

    def assert_untouched(self, *, writes_allowed: bool = True) -> None:
        """Since the snapshot, no element changed except where the op may write
        (none at all with writes_allowed=False). Compared bit for bit, NaN included."""
        for i, (b, s, mask) in enumerate(zip(self.buffers, self.saved, self.writable)):
            keep = torch.ones(b.shape, dtype=torch.bool, device=b.device)
            if writes_allowed and mask is not None:
                keep &= ~mask
            same = _bits(b)[keep] == _bits(s)[keep]
            assert bool(same.all()), (f"buffer {i} ({list(b.shape)} {b.dtype}): {int((~same).sum())} elements "
                                      "outside what the op may write changed")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


# --- the spec of an op ----------------------------------------------------------------------

@dataclass
class Expect:
    """One output: its float64 value, the magnitude its error is measured against
    (broadcastable to value) and its dtype."""

    value: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype


def magnitude(*terms: torch.Tensor) -> torch.Tensor:
    """max(|t| for t in terms, 1), elementwise."""
    out = None
    for t in terms:
        a = t.abs()
        out = a if out is None else torch.maximum(out, a)
    return out.clamp_min(1.0)


def assert_matches(outputs: Sequence[torch.Tensor], expected: Sequence[Expect], tolerance: float,
                   device: Optional[torch.device] = None, what: str = "") -> None:
    """Every output has its expected shape, dtype (and device) and is within
    tolerance * scale of its float64 value; NaN (an element never written) fails."""
    assert len(outputs) == len(expected), f"{what}: {len(outputs)} outputs, expected {len(expected)}"
    for i, (out, exp) in enumerate(zip(outputs, expected)):
        where = f"{what} output {i}"
        assert tuple(out.shape) == tuple(exp.value.shape), f"{where}: shape {list(out.shape)}, " \
                                                           f"expected {list(exp.value.shape)}"
        assert out.dtype == exp.dtype, f"{where}: dtype {out.dtype}, expected {exp.dtype}"
        if device is not None:
            assert out.device == device, f"{where}: on {out.device}, expected {device}"
        if out.numel() == 0:
            continue
        err = (out.double() - exp.value).abs()
        bad = ~(err <= tolerance * exp.scale)
        if bool(bad.any()):
            first = tuple(bad.nonzero()[0].tolist())
            raise AssertionError(f"{where}: {int(bad.sum())} of {bad.numel()} elements off by more than "
                                 f"{tolerance:g} x scale; first at {first}: got {out[first].item()}, expected "
                                 f"{exp.value[first].item()} (scale {exp.scale.expand_as(err)[first].item()})")


@dataclass(frozen=True)
class BadCall:
    """A call the op must reject. `arg`/`replace`: the valid call with one argument
    replaced (replace(args) gives the new value); `move`: that argument on another
    device; `invoke(kernel, args)`: anything else (e.g. the raw op with a bad out).
    `kind` is one of device, dtype, shape, stride, value. `before_device`: the
    check runs before the device check, so it fires on CPU tensors too."""

    label: str
    kind: str
    error: type
    message: Optional[str]
    arg: Optional[str] = None
    replace: Optional[Callable[[Args], Any]] = None
    move: bool = False
    invoke: Optional[Callable[[Any, Args], Any]] = None
    before_device: bool = False

    def run(self, kernel, spec: "OpSpec", args: Args, device: Any = "cpu"):
        if self.invoke is not None:
            return self.invoke(kernel, args)
        bad = dict(args)
        bad[self.arg] = args[self.arg].to(device) if self.move else self.replace(args)
        return spec.call(kernel, bad)


def moved(arg: str, message: str) -> BadCall:
    return BadCall(f"`{arg}` on the CPU", "device", RuntimeError, message, arg=arg, move=True)


def other_dtype(arg: str, like: str = "x") -> BadCall:
    """`arg` in the other half dtype than `like`."""
    return BadCall(f"{arg} of another dtype", "dtype", TypeError, f"`{arg}` has dtype", arg=arg,
                   replace=lambda a: a[arg].to(other_half(a[like].dtype)))


def one_short(arg: str) -> BadCall:
    """`arg` one element short along its last dim."""
    return BadCall(f"{arg} one short", "shape", RuntimeError, f"`{arg}` has shape", arg=arg,
                   replace=lambda a: drop_last(a[arg]))


@dataclass(frozen=True)
class OpSpec:
    name: str                                   # registry id (test ids)
    api: str                                    # the exported function it calls
    dtypes: Tuple[torch.dtype, ...]
    random_problem: Callable[[Pick], dict]
    canonical: Callable[[str, str], Optional[dict]]  # (small|medium|ltx|big, vector|fallback)
    make: Callable[[dict, torch.dtype, Arena], Args]
    call: Callable[[Any, Args], Tuple[torch.Tensor, ...]]
    reference: Callable[[Args], List[Expect]]
    errors: Tuple[BadCall, ...]
    main: str = "x"                             # the argument whose size defines the problem
    tolerance: Dict[torch.dtype, float] = field(default_factory=lambda: dict(TOLERANCE))
    deterministic: bool = True                  # bitwise the same result for the same input
    big_axis: int = 1                           # the axis big tests sample along
    reference_at: Optional[Callable[[Args, int, torch.Tensor], List[Expect]]] = None
    # The arguments a backward gives grads for (ops in ltx_kernels.DIFFERENTIABLE); None: every floating
    # tensor argument. Tables the op treats as constants (RoPE cos/sin) are left out.
    grad_args: Optional[Tuple[str, ...]] = None
    # (float64 args, float64 output grads) -> {argument: magnitude}: where a grad is a difference of
    # larger terms (a normalisation's dx on very short rows), the terms' magnitude its error is
    # measured against; otherwise the grad's own max |value|.
    grad_scale: Optional[Callable[[Args, List[torch.Tensor]], Dict[str, float]]] = None

    def build(self, problem: dict, dtype: torch.dtype, source: Source, *, sentinel: bool = True
              ) -> Tuple[Args, Arena]:
        arena = Arena(source, sentinel=sentinel)
        return self.make(problem, dtype, arena), arena

    def expected_at(self, args: Args, axis: int, index: torch.Tensor) -> List[Expect]:
        """The reference for the entries `index` along `axis` only (large inputs):
        every tensor argument spanning the main argument's extent along `axis` is
        sampled there, the others (weights, per-batch modulation) are kept."""
        if self.reference_at is not None:
            return self.reference_at(args, axis, index)
        extent = args[self.main].shape[axis]
        sampled = {k: (v.index_select(axis, index) if isinstance(v, torch.Tensor) and v.dim() > axis
                       and v.shape[axis] == extent else v) for k, v in args.items()}
        return self.reference(sampled)


# --- shared pieces ----------------------------------------------------------------------------

def other_half(dtype: torch.dtype) -> torch.dtype:
    return F16 if dtype == BF16 else BF16


def drop_last(t: torch.Tensor) -> torch.Tensor:
    """t without its last element along the last dim (a shape one short)."""
    return t[..., :-1]


def strided_like(t: torch.Tensor) -> torch.Tensor:
    """A tensor of t's shape and dtype whose last dim has stride 2."""
    return torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)[..., ::2]


def rms64(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """(x * r, x * r * w) in float64, r = rsqrt(mean(x^2) + eps) over the last dim."""
    n = rms_norm_f64(x, None, eps)
    return n, (n * weight.double() if weight is not None else n)


def rows_of(mod: Optional[torch.Tensor], x: torch.Tensor) -> Optional[torch.Tensor]:
    """A modulation tensor as float64, broadcastable to x the way the fused kernels
    read it: for [B, S, D] x, [B', D] is per batch; for [R, D] x (batch R, seq 1),
    [R', 1, D] is per row."""
    if mod is None:
        return None
    m = mod.double()
    if x.dim() == 3 and m.dim() == 2:
        return m.unsqueeze(1)
    if x.dim() == 2 and m.dim() == 3:
        return m[:, 0]
    return m


def row_shape(pick: Pick, w: int) -> Tuple[int, ...]:
    """[R, D] or [B, S, D] rows for the fused ops."""
    if pick.boolean():
        return (*fit([count(pick)], w), w)
    b, s = count(pick, 4), count(pick)
    return (*fit([b, s], w), w)


def mod_shape(pick: Pick, x_shape: Tuple[int, ...]) -> Tuple[int, ...]:
    """One of the modulation forms that broadcast to the rows of x."""
    d = x_shape[-1]
    if len(x_shape) == 3:
        b, s = x_shape[:2]
        return pick.choice(((d,), (b, d), (1, d), (b, 1, d), (1, 1, d), (1, s, d), (b, s, d)))
    r = x_shape[0]
    return pick.choice(((d,), (r, d), (1, d), (r, 1, d), (1, 1, d)))


def fixed_rows(size: str, path: str, ltx: Tuple[int, ...] = (2, 2688, 2048)) -> Optional[dict]:
    """Shape and main-input layout of the fixed problems of the row ops: the
    fallback path by a misaligned pointer (small, big) or an odd width (medium)."""
    shapes = {"small": (2, 5, 64), "medium": (3, 40, 1000 if path == "fallback" else 1024), "ltx": ltx,
              "big": (1, (1 << 31) // 4096 + 8, 4096)}
    if size == "ltx" and path == "fallback":
        return None
    lay = ("offset", 1) if path == "fallback" and size != "medium" else CONTIGUOUS
    return {"shape": shapes[size], "x_layout": lay}


def mod_dtype(p: dict, dtype: torch.dtype) -> torch.dtype:
    return F32 if p.get("mod_dtype") == "float32" else dtype


# --- rmsnorm ------------------------------------------------------------------------------------

def rmsnorm_problem(rounding: str) -> Callable[[Pick], dict]:
    def draw(pick: Pick) -> dict:
        hidden = width(pick, large=(16392, 32776, 65544, 70001))  # past the 8192-word vectorised limit
        lead = fit([count(pick, 9) for _ in range(pick.integer(0, 3))], hidden)
        out = pick.choice(("new", "given", "given_float32", "in_place"))
        return {"shape": (*lead, hidden), "rounding": rounding, "eps": pick.choice(EPS),
                "weight": pick.choice((None, "same", "float32")), "out": out,
                "x_layout": layout(pick, ("contiguous", "offset", "front_pad") if out == "in_place" else ANY_LAYOUT),
                "weight_layout": layout(pick, DENSE),  # the binding wants a contiguous weight
                "out_layout": layout(pick, ("contiguous", "offset", "front_pad"))}
    return draw


def rmsnorm_canonical(rounding: str) -> Callable[[str, str], Optional[dict]]:
    def fixed(size: str, path: str) -> Optional[dict]:
        base = fixed_rows(size, path)
        if base is None:
            return None
        if size == "big":  # 2^32 elements, the issue's example
            base["shape"] = (1, 1 << 20, 4096)
        return {"shape": base["shape"], "rounding": rounding, "eps": 1e-6, "weight": "same", "out": "new",
                "x_layout": base["x_layout"], "weight_layout": CONTIGUOUS, "out_layout": CONTIGUOUS}
    return fixed


def rmsnorm_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    shape = p["shape"]
    x = arena.tensor(shape, dtype, p["x_layout"], writable=p["out"] == "in_place")
    weight = None
    if p["weight"]:
        weight = arena.tensor(shape[-1:], dtype if p["weight"] == "same" else F32, p["weight_layout"], values=WEIGHTS)
    out = {"new": None, "in_place": x}.get(p["out"])
    if p["out"] in ("given", "given_float32"):
        out = arena.output(shape, dtype if p["out"] == "given" else F32, p["out_layout"])
    return {"x": x, "weight": weight, "eps": p["eps"], "out": out, "rounding": p["rounding"]}


def rmsnorm_call(k, a: Args):
    y = k.rmsnorm(a["x"], a["weight"], a["eps"], out=a["out"], rounding=a["rounding"])
    assert a["out"] is None or y is a["out"], "rmsnorm must return the given out"
    return (y,)


def rmsnorm_reference(a: Args) -> List[Expect]:
    x, w = a["x"], a["weight"]
    n, y = rms64(x, w, a["eps"])
    if a["out"] is not None:
        dtype = a["out"].dtype
    elif a["rounding"] == "diffusers" and w is not None and w.dtype == F32:
        dtype = F32  # diffusers returns float32 with a float32 weight
    else:
        dtype = x.dtype
    return [Expect(y, magnitude(y, n), dtype)]


def rmsnorm_grad_scale(a: Args, dys: List[torch.Tensor]) -> Dict[str, float]:
    """dx = r * (g - n * mean(g * n)) cancels on short rows: measure it against r * |g|."""
    x, w = a["x"].double(), a["weight"]
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + a["eps"])
    g = dys[0].double() * (w.double() if w is not None else 1.0)
    return {"x": float((r * g.abs()).max()) if x.numel() else 0.0}


def rmsnorm_errors() -> Tuple[BadCall, ...]:
    return (
        BadCall("`input` on the CPU", "device", RuntimeError, "`input` must be a CUDA tensor", arg="x", move=True),
        moved("weight", "`weight` is on cpu"),
        BadCall("float64 input", "dtype", TypeError, "supported dtypes are torch.bfloat16", arg="x",
                replace=lambda a: a["x"].double(), before_device=True),
        BadCall("weight of the other half dtype", "dtype", TypeError, "`weight` has dtype", arg="weight",
                replace=lambda a: a["weight"].to(other_half(a["x"].dtype)), before_device=True),
        BadCall("weight one short", "shape", RuntimeError, "`weight` has shape", arg="weight",
                replace=lambda a: drop_last(a["weight"]), before_device=True),
        BadCall("out one short", "shape", RuntimeError, "`out` has shape", arg="out",
                replace=lambda a: torch.empty_like(drop_last(a["x"])), before_device=True),
        BadCall("out with a strided last dim", "stride", RuntimeError, "`out` must have a contiguous last dim",
                arg="out", replace=lambda a: strided_like(a["x"])),
        BadCall("negative eps", "value", RuntimeError, "`eps` must be >= 0", arg="eps", replace=lambda a: -1.0,
                before_device=True),
        BadCall("unknown rounding", "value", ValueError, "`rounding` must be one of", arg="rounding",
                replace=lambda a: "bogus", before_device=True),
    )


# --- the fused norm family ------------------------------------------------------------------------

def fused_common(pick: Pick, x_shape, *, x_layouts=ANY_LAYOUT) -> dict:
    return {"shape": x_shape, "eps": pick.choice(EPS), "exact": pick.boolean(),
            "mod_dtype": pick.choice(("same", "float32")), "x_layout": layout(pick, x_layouts)}


def fused_errors(extra: Tuple[BadCall, ...], mod: Optional[str] = "scale") -> Tuple[BadCall, ...]:
    """Errors every fused op shares (`x` is its row input), plus `extra`."""
    common = (
        BadCall("`x` on the CPU", "device", RuntimeError, "must be a CUDA tensor", arg="x", move=True),
        BadCall("4-D x", "shape", RuntimeError, "reshape it first", arg="x", replace=lambda a: a["x"][None],
                before_device=True),
        BadCall("float64 x", "dtype", TypeError, "supported dtypes are torch.bfloat16", arg="x",
                replace=lambda a: a["x"].double(), before_device=True),
    )
    if mod is None:
        return common + extra
    return common + extra + (
        moved(mod, f"`{mod}` is on cpu"),
        BadCall(f"{mod} that does not broadcast", "shape", RuntimeError, "does not broadcast", arg=mod,
                replace=lambda a: torch.ones(a["x"].shape[-1] + 1, dtype=a[mod].dtype, device=a[mod].device)),
        BadCall(f"{mod} of the other half dtype", "dtype", TypeError, f"`{mod}` has dtype", arg=mod,
                replace=lambda a: a[mod].to(other_half(a["x"].dtype))),
    )


def overlapping_out(op_name: str, build_args: Callable[[Args, torch.Tensor], tuple]) -> BadCall:
    """The raw op with an output expanded from one row (stride 0): rejected as overlapping."""
    def invoke(k, a):
        out = torch.empty_like(a["x"][..., :1, :]).expand_as(a["x"])
        return getattr(k.ops, op_name)(*build_args(a, out))
    return BadCall("out with internal overlap", "stride", RuntimeError, "internal overlap", invoke=invoke)


# rmsnorm_residual

def residual_problem(pick: Pick) -> dict:
    p = fused_common(pick, row_shape(pick, width(pick)))
    p.update(weight=pick.boolean(), rounding=pick.choice(("torch", "diffusers")),
             residual_layout=layout(pick, ANY_LAYOUT), weight_layout=layout(pick, ANY_LAYOUT))
    return p


def fused_canonical(size: str, path: str, eps: float, fields: Callable[[int, int], dict],
                    ltx: Tuple[int, ...] = (2, 2688, 2048)) -> Optional[dict]:
    """fixed_rows with the fused ops' exact mode and same-dtype modulation,
    plus `fields(batch, hidden)`; None where fixed_rows has no problem."""
    base = fixed_rows(size, path, ltx)
    if base is None:
        return None
    b, d = base["shape"][0], base["shape"][-1]
    return {**base, "eps": eps, "exact": True, "mod_dtype": "same", **fields(b, d)}


def residual_canonical(size: str, path: str) -> Optional[dict]:
    return fused_canonical(size, path, 1e-6, lambda b, d: {"weight": True, "rounding": "torch",
                                                           "residual_layout": CONTIGUOUS, "weight_layout": CONTIGUOUS})


def residual_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    shape = p["shape"]
    return {"x": arena.tensor(shape, dtype, p["x_layout"]),
            "residual": arena.tensor(shape, dtype, p["residual_layout"]),
            "weight": arena.tensor(shape[-1:], dtype, p["weight_layout"], values=WEIGHTS) if p["weight"] else None,
            "eps": p["eps"], "rounding": p["rounding"]}


def residual_call(k, a: Args):
    return k.rmsnorm_residual(a["x"], a["residual"], a["weight"], a["eps"], rounding=a["rounding"])


def residual_reference(a: Args) -> List[Expect]:
    x, r = a["x"], a["residual"]
    h64 = x.double() + r.double()
    h = (x + r).double()  # the sum the kernel normalises, rounded to x's dtype as eager rounds it
    n, out = rms64(h, a["weight"], a["eps"])
    return [Expect(out, magnitude(out, n), x.dtype), Expect(h64, magnitude(h64, x, r), x.dtype)]


# adaln_rmsnorm

def adaln_problem(pick: Pick) -> dict:
    p = fused_common(pick, row_shape(pick, width(pick)))
    p.update(weight=pick.boolean(), scale=mod_shape(pick, p["shape"]),
             shift=pick.choice((None, mod_shape(pick, p["shape"]))), weight_layout=layout(pick, ANY_LAYOUT),
             scale_layout=layout(pick, BROADCAST), shift_layout=layout(pick, BROADCAST))
    return p


def adaln_canonical(size: str, path: str) -> Optional[dict]:
    return fused_canonical(size, path, 1e-6, lambda b, d: {
        "weight": True, "scale": (b, 1, d), "shift": (b, 1, d), "weight_layout": CONTIGUOUS,
        "scale_layout": CONTIGUOUS, "shift_layout": CONTIGUOUS})


def modulation(p: dict, name: str, dtype: torch.dtype, arena: Arena, values=MODULATION):
    if p.get(name) is None:
        return None
    return arena.tensor(p[name], mod_dtype(p, dtype), p[f"{name}_layout"], values=values)


def adaln_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    shape = p["shape"]
    return {"x": arena.tensor(shape, dtype, p["x_layout"]),
            "weight": arena.tensor(shape[-1:], dtype, p["weight_layout"], values=WEIGHTS) if p["weight"] else None,
            "scale": modulation(p, "scale", dtype, arena), "shift": modulation(p, "shift", dtype, arena, VALUES),
            "eps": p["eps"], "exact": p["exact"]}


def adaln_call(k, a: Args):
    return (k.adaln_rmsnorm(a["x"], a["weight"], a["scale"], a["shift"], a["eps"], exact_mode=a["exact"]),)


def modulate64(x: torch.Tensor, n: torch.Tensor, scale, shift) -> Tuple[torch.Tensor, torch.Tensor]:
    """(n * (1 + scale) [+ shift], magnitude of its terms), float64."""
    scaled = n * (1 + rows_of(scale, x))
    sh = rows_of(shift, x)
    out = scaled + sh if sh is not None else scaled
    terms = (out, scaled, n) + ((sh,) if sh is not None else ())
    return out, magnitude(*terms)


def adaln_reference(a: Args) -> List[Expect]:
    x = a["x"]
    _, n = rms64(x, a["weight"], a["eps"])
    out, mag = modulate64(x, n, a["scale"], a["shift"])
    return [Expect(out, mag, x.dtype)]


def adaln_args(a: Args, out: torch.Tensor) -> tuple:
    return (out, a["x"], a["weight"], a["scale"], a["shift"], a["eps"], a["exact"])


# gated_residual

def gated_problem(pick: Pick) -> dict:
    in_place = pick.boolean()
    p = fused_common(pick, row_shape(pick, width(pick)), x_layouts=LAST_DIM_CONTIGUOUS if in_place else ANY_LAYOUT)
    p.update(in_place=in_place, gate=pick.choice((None, mod_shape(pick, p["shape"]))),
             y_layout=layout(pick, ANY_LAYOUT), gate_layout=layout(pick, BROADCAST))
    return p


def gated_canonical(size: str, path: str) -> Optional[dict]:
    return fused_canonical(size, path, 0.0, lambda b, d: {
        "in_place": False, "gate": (b, 1, d), "y_layout": CONTIGUOUS, "gate_layout": CONTIGUOUS})


def gated_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    shape = p["shape"]
    return {"x": arena.tensor(shape, dtype, p["x_layout"], writable=p["in_place"]),
            "y": arena.tensor(shape, dtype, p["y_layout"]), "gate": modulation(p, "gate", dtype, arena, VALUES),
            "in_place": p["in_place"], "exact": p["exact"]}


def gated_call(k, a: Args):
    out = k.gated_residual(a["x"], a["y"], a["gate"], inplace=a["in_place"], exact_mode=a["exact"])
    assert not a["in_place"] or out is a["x"], "gated_residual(inplace=True) must return x"
    return (out,)


def gated_sum64(x: torch.Tensor, y: torch.Tensor, gate) -> Tuple[torch.Tensor, torch.Tensor]:
    """(x + y * gate, magnitude of its terms), float64."""
    g = rows_of(gate, x)
    yg = y.double() * g if g is not None else y.double()
    h = x.double() + yg
    return h, magnitude(h, x, yg)


def gated_reference(a: Args) -> List[Expect]:
    h, mag = gated_sum64(a["x"], a["y"], a["gate"])
    return [Expect(h, mag, a["x"].dtype)]


# gated_residual_rmsnorm (the LTX seam)

def seam_problem(pick: Pick) -> dict:
    p = fused_common(pick, row_shape(pick, width(pick)))
    p.update(gate=pick.choice((None, mod_shape(pick, p["shape"]))), scale=mod_shape(pick, p["shape"]),
             shift=pick.choice((None, mod_shape(pick, p["shape"]))), weight=pick.boolean(),
             y_layout=layout(pick, ANY_LAYOUT), gate_layout=layout(pick, BROADCAST),
             scale_layout=layout(pick, BROADCAST), shift_layout=layout(pick, BROADCAST),
             weight_layout=layout(pick, ANY_LAYOUT))
    return p


def seam_canonical(size: str, path: str) -> Optional[dict]:
    base = adaln_canonical(size, path)
    return base and {**base, "gate": base["scale"], "y_layout": CONTIGUOUS, "gate_layout": CONTIGUOUS}


def seam_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    a = adaln_make(p, dtype, arena)
    a.update(y=arena.tensor(p["shape"], dtype, p["y_layout"]), gate=modulation(p, "gate", dtype, arena, VALUES))
    return a


def seam_call(k, a: Args):
    return k.gated_residual_rmsnorm(a["x"], a["y"], a["gate"], a["scale"], a["shift"], a["eps"],
                                    weight=a["weight"], exact_mode=a["exact"])


def seam_reference(a: Args) -> List[Expect]:
    x = a["x"]
    h64, h_mag = gated_sum64(x, a["y"], a["gate"])
    h = h64.to(x.dtype).double()  # the kernel normalises x_new after its rounding to x's dtype
    _, n = rms64(h, a["weight"], a["eps"])
    out, mag = modulate64(x, n, a["scale"], a["shift"])
    return [Expect(out, mag, x.dtype), Expect(h64, h_mag, x.dtype)]


def seam_args(a: Args, out: torch.Tensor) -> tuple:
    return (out, torch.empty_like(a["x"]), a["x"], a["y"], a["gate"], a["weight"], a["scale"], a["shift"], a["eps"],
            a["exact"])


# residual_tanh_gated_rmsnorm (Mochi)

def tanh_problem(pick: Pick) -> dict:
    p = fused_common(pick, row_shape(pick, width(pick)))
    p.update(gate=mod_shape(pick, p["shape"]), x_res_layout=layout(pick, ANY_LAYOUT),
             gate_layout=layout(pick, BROADCAST))
    return p


def tanh_canonical(size: str, path: str) -> Optional[dict]:
    return fused_canonical(size, path, 1e-6, lambda b, d: {
        "gate": (b, d), "x_res_layout": CONTIGUOUS, "gate_layout": CONTIGUOUS}, ltx=(2, 2048, 3072))


def tanh_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    return {"x": arena.tensor(p["shape"], dtype, p["x_layout"]),
            "x_res": arena.tensor(p["shape"], dtype, p["x_res_layout"]),
            "gate": modulation(p, "gate", dtype, arena, VALUES), "eps": p["eps"], "exact": p["exact"]}


def tanh_call(k, a: Args):
    return (k.residual_tanh_gated_rmsnorm(a["x"], a["x_res"], a["gate"], a["eps"], exact_mode=a["exact"]),)


def tanh_reference(a: Args) -> List[Expect]:
    x = a["x"]
    _, n = rms64(a["x_res"], None, a["eps"])
    branch = n * torch.tanh(rows_of(a["gate"], x))
    out = x.double() + branch
    return [Expect(out, magnitude(out, x, branch), x.dtype)]


# modulated_rmsnorm (Mochi)

def modulated_problem(pick: Pick) -> dict:
    p = fused_common(pick, row_shape(pick, width(pick)))
    p.update(scale=mod_shape(pick, p["shape"]), scale_layout=layout(pick, BROADCAST))
    return p


def modulated_canonical(size: str, path: str) -> Optional[dict]:
    return fused_canonical(size, path, 1e-6, lambda b, d: {"scale": (b, d), "scale_layout": CONTIGUOUS})


def modulated_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    return {"x": arena.tensor(p["shape"], dtype, p["x_layout"]), "scale": modulation(p, "scale", dtype, arena),
            "eps": p["eps"]}


def modulated_call(k, a: Args):
    return (k.modulated_rmsnorm(a["x"], a["scale"], a["eps"]),)


def modulated_reference(a: Args) -> List[Expect]:
    x = a["x"]
    _, n = rms64(x, None, a["eps"])
    out, mag = modulate64(x, n, a["scale"], None)
    return [Expect(out, mag, x.dtype)]


# --- layernorm: layernorm, adaln_layernorm, gated_residual_layernorm ------------------------------------

AFFINE = (None, "same", "float32")  # a LayerNorm weight or bias: absent, of x's dtype, or float32 (Wan)
WAN_ROWS = (1, 4096, 3072)  # the model-size problem: Flux's image tokens at hidden 3072


def ln64(x: torch.Tensor, weight, bias, eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """(LayerNorm of x in float64, the magnitude its float32 error scales with): the mean is
    subtracted in float32, so the error is relative to |x| / std (a near-constant row amplifies it),
    not to the normalised value alone."""
    x64 = x.double()
    std = ((x64 - x64.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True) + eps).sqrt()
    y = layer_norm_f64(x, weight, bias, eps)
    cond = x64.abs() / std
    if weight is not None:
        cond = cond * weight.double().abs()
    terms = (y, cond) + ((bias.double().expand_as(y),) if bias is not None else ())
    return y, magnitude(*terms)


def affine(p: dict, name: str, dtype: torch.dtype, arena: Arena, values) -> Optional[torch.Tensor]:
    kind = p[name]
    if kind is None:
        return None
    return arena.tensor((p["shape"][-1],), dtype if kind == "same" else F32, p[f"{name}_layout"], values=values)


def affine_fields(pick: Pick) -> dict:
    return {"weight": pick.choice(AFFINE), "bias": pick.choice(AFFINE), "weight_layout": layout(pick, ANY_LAYOUT),
            "bias_layout": layout(pick, ANY_LAYOUT)}


def ln_canonical_fields() -> dict:
    return {"weight": "same", "bias": "same", "weight_layout": CONTIGUOUS, "bias_layout": CONTIGUOUS}


def affine_errors() -> Tuple[BadCall, ...]:
    return (
        one_short("weight"),
        moved("bias", "`bias` is on cpu"),
        BadCall("bias of the other half dtype", "dtype", TypeError, "`bias` must have the dtype of `x` or "
                "torch.float32", arg="bias", replace=lambda a: a["bias"].to(other_half(a["x"].dtype))),
        BadCall("float64 weight", "dtype", TypeError, "`weight` has dtype Double", arg="weight",
                replace=lambda a: a["weight"].double()),
        BadCall("negative eps", "value", RuntimeError, "`eps` must be >= 0", arg="eps", replace=lambda a: -1.0),
    )


# layernorm

def ln_problem(pick: Pick) -> dict:
    hidden = width(pick)
    lead = fit([count(pick, 9) for _ in range(pick.integer(0, 3))], hidden)
    return {"shape": (*lead, hidden), "eps": pick.choice(EPS), "x_layout": layout(pick, ANY_LAYOUT),
            **affine_fields(pick)}


def ln_canonical(size: str, path: str) -> Optional[dict]:
    base = fixed_rows(size, path, WAN_ROWS)
    return base and {**base, "eps": 1e-6, **ln_canonical_fields()}


def ln_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    return {"x": arena.tensor(p["shape"], dtype, p["x_layout"]),
            "weight": affine(p, "weight", dtype, arena, WEIGHTS), "bias": affine(p, "bias", dtype, arena, VALUES),
            "eps": p["eps"]}


def ln_call(k, a: Args):
    return (k.layernorm(a["x"], a["weight"], a["bias"], a["eps"]),)


def ln_reference(a: Args) -> List[Expect]:
    y, mag = ln64(a["x"], a["weight"], a["bias"], a["eps"])
    return [Expect(y, mag, a["x"].dtype)]


def ln_raw(a: Args, out: torch.Tensor) -> tuple:
    return (out, a["x"], a["weight"], a["bias"], a["eps"])


# adaln_layernorm

def ln_modulate64(x: torch.Tensor, n: torch.Tensor, n_mag: torch.Tensor, scale, shift
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(n * (1 + scale) [+ shift], its error magnitude): modulate64's, with n's own magnitude
    carried through the multiply."""
    out, mag = modulate64(x, n, scale, shift)
    return out, torch.maximum(mag, n_mag * (1 + rows_of(scale, x).abs()))


def adaln_ln_problem(pick: Pick, hidden: Optional[int] = None) -> dict:
    p = fused_common(pick, row_shape(pick, hidden or width(pick)))
    p.update(scale=mod_shape(pick, p["shape"]), shift=pick.choice((None, mod_shape(pick, p["shape"]))),
             scale_layout=layout(pick, BROADCAST), shift_layout=layout(pick, BROADCAST), **affine_fields(pick))
    return p


def adaln_ln_canonical(size: str, path: str) -> Optional[dict]:
    # Flux's AdaLayerNormZero: [B, D] modulation of x's dtype (with an affine norm, so that the weight and
    # bias refusals have something to refuse)
    return fused_canonical(size, path, 1e-6, lambda b, d: {
        "scale": (b, d), "shift": (b, d), "scale_layout": CONTIGUOUS, "shift_layout": CONTIGUOUS,
        **ln_canonical_fields()}, ltx=WAN_ROWS)


def adaln_ln_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    a = ln_make(p, dtype, arena)
    a.update(scale=modulation(p, "scale", dtype, arena), shift=modulation(p, "shift", dtype, arena, VALUES),
             exact=p["exact"])
    return a


def adaln_ln_call(k, a: Args):
    return (k.adaln_layernorm(a["x"], a["scale"], a["shift"], a["eps"], weight=a["weight"], bias=a["bias"],
                              exact_mode=a["exact"]),)


def adaln_ln_reference(a: Args) -> List[Expect]:
    x = a["x"]
    n, n_mag = ln64(x, a["weight"], a["bias"], a["eps"])
    out, mag = ln_modulate64(x, n, n_mag, a["scale"], a["shift"])
    return [Expect(out, mag, x.dtype)]


def adaln_ln_raw(a: Args, out: torch.Tensor) -> tuple:
    return (out, a["x"], a["scale"], a["shift"], a["weight"], a["bias"], a["eps"], a["exact"])


# gated_residual_layernorm

def seam_ln_problem(pick: Pick, hidden: Optional[int] = None) -> dict:
    p = fused_common(pick, row_shape(pick, hidden or width(pick)))
    scale = pick.choice((None, mod_shape(pick, p["shape"])))
    p.update(gate=pick.choice((None, mod_shape(pick, p["shape"]))), scale=scale,
             shift=pick.choice((None, mod_shape(pick, p["shape"]))) if scale else None,
             y_layout=layout(pick, ANY_LAYOUT), gate_layout=layout(pick, BROADCAST),
             scale_layout=layout(pick, BROADCAST), shift_layout=layout(pick, BROADCAST), **affine_fields(pick))
    return p


def seam_ln_canonical(size: str, path: str) -> Optional[dict]:
    base = adaln_ln_canonical(size, path)
    return base and {**base, "gate": base["scale"], "y_layout": CONTIGUOUS, "gate_layout": CONTIGUOUS}


def seam_ln_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    a = adaln_ln_make(p, dtype, arena)
    a.update(y=arena.tensor(p["shape"], dtype, p["y_layout"]), gate=modulation(p, "gate", dtype, arena, VALUES))
    return a


def seam_ln_call(k, a: Args):
    return k.gated_residual_layernorm(a["x"], a["y"], a["gate"], a["eps"], weight=a["weight"], bias=a["bias"],
                                      scale=a["scale"], shift=a["shift"], exact_mode=a["exact"])


def seam_ln_reference(a: Args) -> List[Expect]:
    x = a["x"]
    h64, h_mag = gated_sum64(x, a["y"], a["gate"])
    h = h64.to(x.dtype)  # the kernel normalises x_new after its rounding to x's dtype
    n, n_mag = ln64(h, a["weight"], a["bias"], a["eps"])
    out, mag = ln_modulate64(x, n, n_mag, a["scale"], a["shift"]) if a["scale"] is not None else (n, n_mag)
    return [Expect(out, mag, x.dtype), Expect(h64, h_mag, x.dtype)]


def seam_ln_raw(a: Args, out: torch.Tensor, x_out: Optional[torch.Tensor] = None) -> tuple:
    return (out, torch.empty_like(a["x"]) if x_out is None else x_out, a["x"], a["y"], a["gate"], a["scale"],
            a["shift"], a["weight"], a["bias"], a["eps"], a["exact"])


# --- VAE: pixel_norm, inplace_add ------------------------------------------------------------------

def pixel_norm_problem(pick: Pick) -> dict:
    rank = pick.integer(2, 5)
    dim = pick.integer(-rank, rank - 1)
    channels = pick.choice((1, 3, 4, 16, 128, pick.integer(1, 300), 2049))  # > 2048: scalar path
    dims = [pick.choice((1, 2, 3, 5, 7, 8, 16, 17, 24)) if i else count(pick, 4) for i in range(rank)]
    dims[dim] = channels
    others = fit([d for i, d in enumerate(dims) if i != dim % rank], channels)
    it = iter(others)
    shape = tuple(channels if i == dim % rank else next(it) for i in range(rank))
    out = pick.choice(("new", "given", "in_place"))
    return {"shape": shape, "dim": dim, "eps": pick.choice((1e-8, 1e-6, 1e-3)),
            "rounding": pick.choice(("diffusers", "original")), "out": out,
            "x_layout": layout(pick, DENSE if out == "in_place" else ANY_LAYOUT), "out_layout": layout(pick, DENSE)}


def pixel_norm_canonical(size: str, path: str) -> Optional[dict]:
    shapes = {"small": (2, 16, 3, 4, 8), "medium": (2, 64, 3, 5, 7) if path == "fallback" else (2, 64, 3, 8, 16),
              "ltx": (1, 512, 7, 32, 48), "big": (1, 128, 129, 256, 512)}
    if size == "ltx" and path == "fallback":
        return None
    lay = ("offset", 1) if path == "fallback" and size != "medium" else CONTIGUOUS
    return {"shape": shapes[size], "dim": 1, "eps": 1e-6, "rounding": "diffusers", "out": "new", "x_layout": lay,
            "out_layout": CONTIGUOUS}


def pixel_norm_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    x = arena.tensor(p["shape"], dtype, p["x_layout"], writable=p["out"] == "in_place")
    out = {"new": None, "in_place": x}.get(p["out"])
    if p["out"] == "given":
        out = arena.output(p["shape"], dtype, p["out_layout"])
    return {"x": x, "dim": p["dim"], "eps": p["eps"], "rounding": p["rounding"], "out": out}


def pixel_norm_call(k, a: Args):
    y = k.pixel_norm(a["x"], a["dim"], a["eps"], rounding=a["rounding"], out=a["out"])
    assert a["out"] is None or y is a["out"], "pixel_norm must return the given out"
    return (y,)


def pixel_norm_reference(a: Args) -> List[Expect]:
    y = pixel_norm_f64(a["x"], a["dim"], a["eps"])
    return [Expect(y, magnitude(y), a["x"].dtype)]


def inplace_add_problem(pick: Pick) -> dict:
    rank = pick.integer(1, 5)
    last = width(pick, large=(16384, 16392))
    shape = (*fit([count(pick, 12) for _ in range(rank - 1)], last), last)
    y_rank = pick.integer(0, rank)
    y_shape = tuple(pick.choice((1, s)) for s in shape[rank - y_rank:])
    y_dtype = pick.choice(("same", "float32"))
    alias = None
    if y_shape == shape and y_dtype == "same":
        alias = pick.choice((None, "same", "shifted"))
    return {"shape": shape, "y_shape": y_shape, "y_dtype": y_dtype, "alias": alias,
            "x_layout": CONTIGUOUS if alias == "shifted" else layout(pick, ANY_LAYOUT),
            "y_layout": layout(pick, BROADCAST), "shift": pick.integer(1, 9)}


def inplace_add_canonical(size: str, path: str) -> Optional[dict]:
    shapes = {"small": ((2, 16, 3, 4, 8), (16, 1, 1, 1)), "medium": ((2, 64, 3, 8, 16), (2, 64, 3, 8, 16)),
              "ltx": ((2, 512, 7, 32, 48), (512, 1, 1, 1)), "big": ((1, (1 << 20) + 8, 4096), (4096,))}
    if size == "ltx" and path == "fallback":
        return None
    shape, y_shape = shapes[size]
    return {"shape": shape, "y_shape": y_shape, "y_dtype": "same", "alias": None, "shift": 1,
            "x_layout": ("offset", 1) if path == "fallback" else CONTIGUOUS, "y_layout": CONTIGUOUS}


def inplace_add_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    shape = p["shape"]
    if p["alias"] == "shifted":  # y overlaps x in memory, `shift` elements further on
        n, k = math.prod(shape), p["shift"]
        i = arena.buffer((n + k,), dtype)
        arena.source.fill(arena.view(i, lambda b: b), *VALUES)
        x = arena.view(i, lambda b: b[:n].view(shape), writable=True)
        return {"x": x, "y": arena.view(i, lambda b: b[k:k + n].view(shape))}
    x = arena.tensor(shape, dtype, p["x_layout"], writable=True)
    if p["alias"] == "same":
        return {"x": x, "y": x}
    y = arena.tensor(p["y_shape"], dtype if p["y_dtype"] == "same" else F32, p["y_layout"])
    return {"x": x, "y": y}


def inplace_add_call(k, a: Args):
    out = k.inplace_add(a["x"], a["y"])
    assert out is a["x"], "inplace_add must return x"
    return (out,)


def inplace_add_reference(a: Args) -> List[Expect]:
    x, y = a["x"].double(), a["y"].double()
    out = x + y
    return [Expect(out, magnitude(out, x, y), a["x"].dtype)]


# --- activations -----------------------------------------------------------------------------------

def activation_shape(pick: Pick, last: int) -> Tuple[int, ...]:
    lead = fit([count(pick, 20) for _ in range(pick.integer(0, 3))], last)
    return (*lead, last)


def activation_canonical(ltx: Tuple[int, ...], gated: bool) -> Callable[[str, str], Optional[dict]]:
    def fixed(size: str, path: str) -> Optional[dict]:
        if size == "ltx" and path == "fallback":
            return None
        odd = 2 * 1001 if gated else 1001
        shapes = {"small": (3, 5, 128), "medium": (4, 33, odd if path == "fallback" else 2048), "ltx": ltx,
                  "big": (1, (1 << 31) // 4096 + 8, 4096)}
        lay = ("offset", 1) if path == "fallback" and size != "medium" else CONTIGUOUS
        return {"shape": shapes[size], "x_layout": lay, "approximate": True, "half": "first"}
    return fixed


def gelu_problem(pick: Pick) -> dict:
    return {"shape": activation_shape(pick, width(pick)), "x_layout": layout(pick, ANY_LAYOUT)}


def gelu_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    return {"x": arena.tensor(p["shape"], dtype, p["x_layout"])}


def gelu_reference(a: Args) -> List[Expect]:
    y = gelu_tanh64(a["x"])
    return [Expect(y, magnitude(y), a["x"].dtype)]


def glu_problem(pick: Pick) -> dict:
    half = width(pick, large=(8184, 8192, 8200))
    return {"shape": activation_shape(pick, 2 * half), "x_layout": layout(pick, ANY_LAYOUT),
            "approximate": pick.boolean(), "half": pick.choice(("first", "second"))}


def glu_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    return {"x": arena.tensor(p["shape"], dtype, p["x_layout"]), "approximate": p["approximate"], "half": p["half"]}


def glu_reference(activate: Callable[[Args, torch.Tensor], torch.Tensor]) -> Callable[[Args], List[Expect]]:
    def reference(a: Args) -> List[Expect]:
        first, second = a["x"].double().chunk(2, dim=-1)
        act, other = (first, second) if a["half"] == "first" else (second, first)
        y = activate(a, act) * other
        return [Expect(y, magnitude(y), a["x"].dtype)]
    return reference


def geglu_act(a: Args, t: torch.Tensor) -> torch.Tensor:
    return gelu_tanh64(t) if a["approximate"] else torch.nn.functional.gelu(t)


def glu_raw_op(kernel, name: str) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """The raw geglu / swiglu op, first half activated, exact."""
    if name == "geglu":
        return lambda out, x: kernel.ops.geglu(out, x, True, True, False)
    return lambda out, x: kernel.ops.swiglu(out, x, True, False)


def glu_errors(name: str) -> Tuple[BadCall, ...]:
    return (
        BadCall("`input` on the CPU", "device", RuntimeError, "`input` must be a CUDA tensor", arg="x", move=True),
        BadCall("float64 input", "dtype", TypeError, "`input` has dtype Double", arg="x",
                replace=lambda a: a["x"].double(), before_device=True),
        BadCall("odd last dim", "shape", RuntimeError, "must be even", arg="x", replace=lambda a: drop_last(a["x"]),
                before_device=True),
        BadCall("unknown half", "value", ValueError, "'first' or 'second'", arg="half", replace=lambda a: "last",
                before_device=True),
        BadCall("raw op with a strided out", "stride", RuntimeError, "`out` must be contiguous",
                invoke=lambda k, a: glu_raw_op(k, name)(strided_like(a["x"][..., : a["x"].shape[-1] // 2]), a["x"])),
    )


def head_gate_problem(pick: Pick) -> dict:
    """Heads of whole 16-byte words (vectorised) or not (the scalar kernel), LTX-2's 32 x 128 and 32 x 64."""
    heads = pick.choice((1, 2, 3, 7, 32, pick.integer(1, 40)))
    head_dim = pick.choice((1, 3, 4, 8, 12, 16, 64, 128, 130, pick.integer(1, 200)))
    return {"shape": activation_shape(pick, heads * head_dim), "heads": heads, "x_layout": layout(pick, ANY_LAYOUT),
            "logits_layout": layout(pick, BROADCAST), "scale": pick.choice((2.0, 1.0, 0.5, 3.25)),
            "exact_mode": pick.boolean()}


def head_gate_canonical(size: str, path: str) -> Optional[dict]:
    """The fallback by a misaligned x (small, big) or a head dim of 13 elements (medium)."""
    if size == "ltx" and path == "fallback":
        return None
    shapes = {"small": ((3, 5, 4 * 64), 4), "medium": ((4, 33, 32 * (13 if path == "fallback" else 64)), 32),
              "ltx": ((2, 6144, 32 * 128), 32), "big": ((1, (1 << 31) // 4096 + 8, 4096), 32)}
    shape, heads = shapes[size]
    lay = ("offset", 1) if path == "fallback" and size != "medium" else CONTIGUOUS
    return {"shape": shape, "heads": heads, "x_layout": lay, "logits_layout": CONTIGUOUS, "scale": 2.0,
            "exact_mode": True}


def head_gate_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    shape = p["shape"]
    return {"x": arena.tensor(shape, dtype, p["x_layout"]),
            # logits up to +-6: gates from 0.005 to 1.995
            "logits": arena.tensor((*shape[:-1], p["heads"]), dtype, p["logits_layout"], values=(0.0, 6.0)),
            "scale": p["scale"], "exact_mode": p["exact_mode"]}


def head_gate_call(k, a: Args):
    return (k.head_gate(a["x"], a["logits"], scale=a["scale"], exact_mode=a["exact_mode"]),)


def head_gate_reference(a: Args) -> List[Expect]:
    y = head_gate64(a["x"], a["logits"], a["scale"])
    return [Expect(y, magnitude(y), a["x"].dtype)]


def head_gate_grad_scale(a: Args, dys: List[torch.Tensor]) -> Dict[str, float]:
    """A logit's grad is scale * sigmoid'(l) * sum(dy * x) over its head; exact mode rounds the sigmoid
    (eager's chain), so where it nears 1 the derivative is lost to rounding: measure the logits' grads
    against scale * max sigmoid' (1/4) * sum |dy * x|."""
    x, logits = a["x"].double(), a["logits"]
    if x.numel() == 0 or logits.numel() == 0:
        return {}
    per_head = (dys[0].double() * x).abs().reshape(*x.shape[:-1], logits.shape[-1], -1).sum(-1)
    return {"logits": float(abs(a["scale"]) * 0.25 * per_head.max())}


def head_gate_errors() -> Tuple[BadCall, ...]:
    return (
        BadCall("`x` on the CPU", "device", RuntimeError, "`x` must be a CUDA tensor", arg="x", move=True),
        moved("logits", "`logits` is on cpu"),
        BadCall("float64 x", "dtype", TypeError, "`x` has dtype Double", arg="x", replace=lambda a: a["x"].double(),
                before_device=True),
        BadCall("logits of another dtype", "dtype", TypeError, "`logits` has dtype", arg="logits",
                replace=lambda a: a["logits"].to(other_half(a["x"].dtype)), before_device=True),
        BadCall("x one short: heads do not divide it", "shape", RuntimeError,
                "must be a multiple of the number of heads", arg="x", replace=lambda a: drop_last(a["x"]),
                before_device=True),
        BadCall("logits with an extra leading dim", "shape", RuntimeError, "`logits` has shape", arg="logits",
                replace=lambda a: a["logits"][None], before_device=True),
        BadCall("0-d x", "shape", RuntimeError, "at least one dimension", arg="x",
                replace=lambda a: a["x"].reshape(-1)[0], before_device=True),
        BadCall("raw op with a strided out", "stride", RuntimeError, "`out` must be contiguous",
                invoke=lambda k, a: k.ops.head_gate(strided_like(a["x"]), a["x"], a["logits"], 2.0, True)),
    )


def linear_gelu_problem(pick: Pick) -> dict:
    k_dim = pick.choice((1, 7, 8, 16, 64, 127, 256, pick.integer(1, 512)))
    lead = fit([count(pick, 20, zero=False) for _ in range(pick.integer(0, 2))], k_dim)
    return {"shape": (*lead, k_dim), "n": pick.choice((1, 2, 8, 31, 64, pick.integer(1, 300))),
            "x_layout": layout(pick, ANY_LAYOUT), "weight_layout": layout(pick, ("contiguous", "transposed")),
            "bias_layout": layout(pick, DENSE)}


def linear_gelu_canonical(size: str, path: str) -> Optional[dict]:
    if size == "big" or (size == "ltx" and path == "fallback"):
        return None  # the GEMM is cuBLAS's: nothing of ours indexes it
    shapes = {"small": ((3, 5, 64), 32), "medium": ((2, 40, 1000), 300), "ltx": ((2, 2688, 2048), 8192)}
    shape, n = shapes[size]
    return {"shape": shape, "n": n, "x_layout": ("offset", 1) if path == "fallback" else CONTIGUOUS,
            "weight_layout": CONTIGUOUS, "bias_layout": CONTIGUOUS}


def linear_gelu_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    k_dim, n = p["shape"][-1], p["n"]
    return {"x": arena.tensor(p["shape"], dtype, p["x_layout"]),
            "weight": arena.tensor((n, k_dim), dtype, p["weight_layout"], values=(0.0, 1.0 / math.sqrt(k_dim))),
            "bias": arena.tensor((n,), dtype, p["bias_layout"], values=(0.0, 1.0))}


def linear_gelu_reference(a: Args) -> List[Expect]:
    x, w, b = a["x"].double(), a["weight"].double(), a["bias"].double()
    pre = x @ w.t() + b
    y = gelu_tanh64(pre)
    terms = x.abs() @ w.abs().t() + b.abs()  # the GEMM rounds relative to these
    return [Expect(y, magnitude(y, terms), a["x"].dtype)]


def linear_gelu_grad_scale(a: Args, dys: List[torch.Tensor]) -> Dict[str, float]:
    """The GEMM's output is rounded to the input dtype before GELU's derivative is taken there, so
    gelu'(z) is off by up to |gelu''| (< 1) times z's rounding, which scales with |x| @ |w|.T + |b|; where
    gelu' nears 0 (z ~ -0.75) that is all a grad is made of. Measure each grad against its products with
    |dy| * (1 + those terms) in place of dy * gelu'(z) (|gelu'| < 1.13)."""
    x, w, b = a["x"].double(), a["weight"].double(), a["bias"].double()
    if x.numel() == 0 or w.numel() == 0:
        return {}
    x2 = x.reshape(-1, x.shape[-1])
    m = dys[0].double().abs().reshape(-1, w.shape[0]) * (1.13 + x2.abs() @ w.abs().t() + b.abs())
    return {"x": float((m @ w.abs()).max()), "weight": float((m.t() @ x2.abs()).max()), "bias": float(m.sum(0).max())}


# --- RoPE ---------------------------------------------------------------------------------------------

def rotate64(n: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotation: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """(n * cos + partner * sin, |n| + |partner| for its error scale), float64."""
    partner = rotate_pairs(n, rotation)
    out = n * cos.double() + partner * sin.double()
    return out, magnitude(n.abs() + partner.abs())


def even(n: int) -> int:
    return max(2, n + (n % 2))


def rotary_problem(pick: Pick) -> dict:
    d = even(width(pick))
    b, s = fit([count(pick, 4), count(pick)], d)
    out = pick.choice(("new", "given", "in_place"))
    return {"shape": (b, s, d), "table_batch": pick.choice((1, b)), "out": out,
            "x_layout": layout(pick, LAST_DIM_CONTIGUOUS if out == "in_place" else ANY_LAYOUT),
            "table_layout": layout(pick, ("contiguous", "offset", "step2", "expanded")),
            "out_layout": layout(pick, LAST_DIM_CONTIGUOUS)}


def rotary_canonical(size: str, path: str) -> Optional[dict]:
    base = fixed_rows(size, path)
    if base is None:
        return None
    if size == "big":  # shared tables: 2 GiB each instead of 8
        base["shape"] = (4, (1 << 31) // (4 * 2048) + 8, 2048)
    return {**base, "table_batch": 1, "out": "new", "table_layout": CONTIGUOUS, "out_layout": CONTIGUOUS}


def rotary_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    b, s, d = p["shape"]
    x = arena.tensor(p["shape"], dtype, p["x_layout"], writable=p["out"] == "in_place")
    cos, sin = arena.tables((p["table_batch"], s, d), p["table_layout"])
    out = {"new": None, "in_place": x}.get(p["out"])
    if p["out"] == "given":
        out = arena.output(p["shape"], dtype, p["out_layout"])
    return {"x": x, "cos": cos, "sin": sin, "out": out}


def rotary_call(k, a: Args):
    y = k.apply_rotary_emb(a["x"], a["cos"], a["sin"], out=a["out"])
    assert a["out"] is None or y is a["out"], "apply_rotary_emb must return the given out"
    return (y,)


def rotary_reference(a: Args) -> List[Expect]:
    out, mag = rotate64(a["x"].double(), a["cos"], a["sin"], "interleaved")
    return [Expect(out, mag, a["x"].dtype)]


# qk_rmsnorm_rope

HEAD_DIMS = (2, 4, 6, 8, 10, 16, 30, 32, 62, 64, 96, 128, 130, 256)


def qk_problem(pick: Pick) -> dict:
    form = pick.choice(("ltx", "heads3", "heads4"))
    if form == "ltx":
        head_dim, heads = None, 1
        d = even(width(pick))
    else:
        head_dim, heads = pick.choice(HEAD_DIMS), pick.integer(1, 8)
        d = head_dim * heads
    b, s = fit([count(pick, 3), count(pick, 40)], 2 * d)
    shape = (b, s, heads, head_dim) if form == "heads4" else (b, s, d)
    in_place = pick.boolean()
    if in_place:
        kinds = ("contiguous", "offset", "outer_gap", "transposed") + (("front_pad",) if len(shape) == 3 else ())
    else:
        kinds = ANY_LAYOUT
    return {"shape": shape, "form": form, "head_dim": head_dim,
            "rotation": "interleaved" if form == "ltx" else pick.choice(("interleaved", "half")),
            "rounding": pick.choice(("torch", "diffusers")), "weight": pick.choice((None, "same", "float32")),
            "q_weight": pick.boolean(), "k_weight": pick.boolean(),
            "table_cols": pick.choice(("full", "repeat")) if form == "ltx" else pick.choice(("full", "head")),
            "table_batch": pick.choice(("2d", "1", "batch", "expanded")), "exact": pick.boolean(),
            "in_place": in_place, "eps": pick.choice(EPS), "q_layout": layout(pick, kinds),
            "k_layout": layout(pick, kinds), "table_layout": layout(pick, ("contiguous", "offset", "step2"))}


def qk_canonical(size: str, path: str) -> Optional[dict]:
    base = fixed_rows(size, path)
    if base is None:
        return None
    shape = base["shape"]
    if size == "big":  # [1, S, 32, 128] per head, per-head tables
        shape = (1, (1 << 31) // 4096 + 8, 32, 128)
    return {"shape": shape, "form": "heads4" if size == "big" else "ltx", "head_dim": 128 if size == "big" else None,
            "rotation": "interleaved", "rounding": "torch", "weight": "same", "q_weight": True, "k_weight": True,
            "table_cols": "head" if size == "big" else "full", "table_batch": "1", "exact": True, "in_place": False,
            "eps": 1e-5, "q_layout": base["x_layout"], "k_layout": CONTIGUOUS, "table_layout": CONTIGUOUS}


def repeating_cols(d: int) -> int:
    """Columns of tables that repeat along a whole-row norm of width ``d`` (Wan: one head's, D / H): the
    widest even proper divisor of ``d`` among D / 2 ... D / 12, else ``d``."""
    return next((d // r for r in (2, 3, 4, 6, 12) if d % r == 0 and (d // r) % 2 == 0), d)


def qk_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    shape = p["shape"]
    q = arena.tensor(shape, dtype, p["q_layout"], writable=p["in_place"])
    k = arena.tensor(shape, dtype, p["k_layout"], writable=p["in_place"])
    b, s = shape[:2]
    d = shape[2] * shape[3] if len(shape) == 4 else shape[2]
    group = p["head_dim"] or d
    wd = p["weight"]
    if wd == "float32" and p["rounding"] == "diffusers" and dtype != F32:
        wd = "same"  # diffusers returns float32 there: the op refuses the combination
    weights = {}
    for name in ("q_weight", "k_weight"):
        present = wd is not None and p[name]
        weights[name] = arena.tensor((group,), dtype if wd == "same" else F32, values=WEIGHTS) if present else None
    cols = {"full": d, "head": group, "repeat": repeating_cols(d)}[p["table_cols"]]
    table_shape = {"2d": (s, cols), "1": (1, s, cols)}.get(p["table_batch"], (b, s, cols))
    cos, sin = arena.tables(table_shape, ("expanded", 0) if p["table_batch"] == "expanded" else p["table_layout"])
    return {"q": q, "k": k, **weights, "cos": cos, "sin": sin, "eps": p["eps"], "head_dim": p["head_dim"],
            "rotation": p["rotation"], "rounding": p["rounding"], "exact": p["exact"], "in_place": p["in_place"]}


def qk_call(k, a: Args):
    qo, ko = k.qk_rmsnorm_rope(a["q"], a["k"], a["q_weight"], a["k_weight"], a["cos"], a["sin"], a["eps"],
                               head_dim=a["head_dim"], rotation=a["rotation"], rounding=a["rounding"],
                               exact_mode=a["exact"], inplace=a["in_place"])
    assert not a["in_place"] or (qo is a["q"] and ko is a["k"]), "in place, qk_rmsnorm_rope must return q and k"
    return qo, ko


def qk_reference(a: Args) -> List[Expect]:
    q = a["q"]
    b, s = q.shape[:2]
    group = a["head_dim"] or (q.shape[-1] if q.dim() == 4 else q.shape[2])
    cos, sin = (t.unsqueeze(0) if t.dim() == 2 else t for t in (a["cos"], a["sin"]))

    def one(x: torch.Tensor, w: Optional[torch.Tensor]) -> Expect:
        x3 = x.reshape(b, s, math.prod(x.shape[2:]))
        groups = x3.shape[-1] // group
        xg = x3.double().unflatten(-1, (groups, group))
        _, n = rms64(xg, w, a["eps"])
        if cos.shape[-1] == group:  # one table column per head channel, shared by the heads
            c, sn = cos.unsqueeze(-2), sin.unsqueeze(-2)
        else:  # one column per channel, or columns repeating along the row
            tile = (1,) * (cos.dim() - 1) + (x3.shape[-1] // cos.shape[-1],)
            c, sn = (t.repeat(tile).unflatten(-1, (groups, group)) for t in (cos, sin))
        out, mag = rotate64(n, c, sn, a["rotation"])
        return Expect(out.flatten(-2).reshape(x.shape), mag.flatten(-2).reshape(x.shape), x.dtype)

    return [one(q, a["q_weight"]), one(a["k"], a["k_weight"])]


def qk_raw_args(a: Args, q_out: torch.Tensor, k_out: torch.Tensor) -> tuple:
    """The raw op's arguments for the canonical (LTX) problem with the given outputs."""
    cos, sin = (t.unsqueeze(0) if t.dim() == 2 else t for t in (a["cos"], a["sin"]))
    return (q_out, k_out, a["q"], a["k"], a["q_weight"], a["k_weight"], cos, sin, a["q"].shape[-1], a["eps"],
            "interleaved", False, True)


# rope_3d, rope_1d

def rope_axes_problem(three_d: bool) -> Callable[[Pick], dict]:
    def draw(pick: Pick) -> dict:
        head_dim = pick.choice((2, 4, 6, 8, 12, 34, 36, 64, 80, 96, 128, 130, 256, 510, 512))
        hq, hk = pick.integer(0, 6), pick.integer(0, 6)
        b = count(pick, 3)
        if three_d:
            grid = [pick.choice((1, 2, 3, 5, 8, 13)) if pick.boolean() else count(pick, 12) for _ in range(3)]
        else:
            grid = [count(pick, 600), 1, 1]
        b, *grid = fit([b, *grid], max(hq + hk, 1) * head_dim)
        return {"batch": b, "grid": tuple(grid), "heads": (hq, hk), "head_dim": head_dim,
                "theta": pick.choice((10000.0, 500.0, 1e6, 1.0, 0.5)), "packed": pick.boolean(),
                "q_layout": layout(pick, LAST_DIM_CONTIGUOUS), "k_layout": layout(pick, LAST_DIM_CONTIGUOUS)}
    return draw


def rope_axes_canonical(three_d: bool) -> Callable[[str, str], Optional[dict]]:
    def fixed(size: str, path: str) -> Optional[dict]:
        if size == "ltx" and path == "fallback":
            return None
        # big: > 2^31 elements in query ([1, S, 8, 128], S > 2^21)
        grids = {"small": (3, 4, 5), "medium": (4, 6, 10), "ltx": (21, 30, 52) if three_d else (2688, 1, 1),
                 "big": (129, 128, 128) if three_d else ((1 << 21) + 1, 1, 1)}
        heads = {"small": (4, 2), "medium": (6, 2), "ltx": (12, 12) if three_d else (32, 32), "big": (8, 1)}
        head_dim = {"small": 64, "medium": 130 if path == "fallback" else 128, "ltx": 128 if three_d else 64,
                    "big": 128}[size]
        grid = grids[size] if three_d else (grids[size][0], 1, 1)
        if not three_d and size in ("small", "medium"):
            grid = (math.prod(grids[size]), 1, 1)
        lay = ("offset", 1) if path == "fallback" and size != "medium" else CONTIGUOUS
        batch = 1 if size == "big" or (three_d and size == "ltx") else 2
        return {"batch": batch, "grid": grid,
                "heads": heads[size], "head_dim": head_dim, "theta": 10000.0, "packed": False, "q_layout": lay,
                "k_layout": CONTIGUOUS}
    return fixed


def rope_axes_make(three_d: bool) -> Callable[[dict, torch.dtype, Arena], Args]:
    def make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
        (hq, hk), d, b = p["heads"], p["head_dim"], p["batch"]
        seq = math.prod(p["grid"])
        if p["packed"]:  # disjoint views of one [B, S, Hq + Hk, D] buffer, as a fused qkv projection gives
            i = arena.buffer((b, seq, hq + hk, d), dtype)
            arena.source.fill(arena.view(i, lambda t: t), *VALUES)
            q = arena.view(i, lambda t: t[:, :, :hq], writable=True)
            k = arena.view(i, lambda t: t[:, :, hq:], writable=True)
        else:
            q = arena.tensor((b, seq, hq, d), dtype, p["q_layout"], writable=True)
            k = arena.tensor((b, seq, hk, d), dtype, p["k_layout"], writable=True)
        return {"q": q, "k": k, "grid": p["grid"], "theta": p["theta"], "three_d": three_d}
    return make


def rope_axes_call(k, a: Args):
    if a["three_d"]:
        q, kk = k.rope_3d(a["q"], a["k"], *a["grid"], theta_base=a["theta"])
    else:
        q, kk = k.rope_1d(a["q"], a["k"], theta_base=a["theta"])
    # In place, unless autograd records (then out of place, the inputs untouched).
    recording = torch.is_grad_enabled() and (a["q"].requires_grad or a["k"].requires_grad)
    assert recording or (q is a["q"] and kk is a["k"]), "rope_3d/rope_1d must return query and key"
    return q, kk


def pair_magnitude(x: torch.Tensor) -> torch.Tensor:
    m = x.double().abs().unflatten(-1, (-1, 2)).sum(-1, keepdim=True)
    return magnitude(m.expand(*m.shape[:-1], 2).flatten(-2))


def rope_axes_reference(a: Args) -> List[Expect]:
    q, k = a["q"], a["k"]
    if a["three_d"]:
        rq, rk = rope_3d_f64(q, k, *a["grid"], theta=a["theta"])
    else:
        rq, rk = rope_1d_f64(q, k, theta=a["theta"])
    return [Expect(rq, pair_magnitude(q), q.dtype), Expect(rk, pair_magnitude(k), k.dtype)]


def rope_axes_reference_at(a: Args, axis: int, index: torch.Tensor) -> List[Expect]:
    """The rotation of the tokens `index` only, at their own grid positions."""
    assert axis == 1
    q, k = a["q"].index_select(1, index), a["k"].index_select(1, index)
    head_dim = q.shape[-1]
    s = index.to(q.device, F64)
    if a["three_d"]:
        _, height, width = a["grid"]
        row = torch.floor(s / width)
        positions = (torch.floor(row / height), row - torch.floor(row / height) * height, s - row * width)
        split = rope_3d_split(head_dim)
    else:
        positions, split = (s,), (head_dim,)
    angles = torch.cat([p[:, None] * axis_freqs(d, a["theta"], q.device)[None, :]
                        for p, d in zip(positions, split)], dim=1)
    return [Expect(rotate_f64(q, angles), pair_magnitude(q), q.dtype),
            Expect(rotate_f64(k, angles), pair_magnitude(k), k.dtype)]


def rope_axes_errors(three_d: bool) -> Tuple[BadCall, ...]:
    def odd(k, a):  # both tensors one channel short: an odd head_dim
        q, kk = drop_last(a["q"]), drop_last(a["k"])
        return rope_axes_call(k, {**a, "q": q, "k": kk})

    errors = (
        moved("k", "`key` is on cpu but `query` is on cuda"),
        BadCall("key of the other half dtype", "dtype", TypeError, "`key` has dtype", arg="k",
                replace=lambda a: a["k"].to(other_half(a["q"].dtype)), before_device=True),
        BadCall("query as key", "stride", RuntimeError, "`query` and `key` overlap in memory", arg="k",
                replace=lambda a: a["q"], before_device=True),
        BadCall("key with a strided last dim", "stride", RuntimeError, "`key` must have a contiguous last dim",
                arg="k", replace=lambda a: strided_like(a["k"]).copy_(a["k"]), before_device=True),
        BadCall("theta_base 0", "value", RuntimeError, "`theta_base` must be finite and > 0", arg="theta",
                replace=lambda a: 0.0, before_device=True),
        BadCall("odd head_dim", "shape", RuntimeError, "must be even", invoke=odd, before_device=True),
    )
    if three_d:
        errors += (BadCall("grid that does not cover seq", "shape", RuntimeError, "must equal the seq dim", arg="grid",
                           replace=lambda a: (a["grid"][0] + 1, *a["grid"][1:]), before_device=True),)
    return errors


# --- the registry -------------------------------------------------------------------------------------

def _rmsnorm_spec(name: str, rounding: str) -> OpSpec:
    return OpSpec(name, "rmsnorm", ALL_DTYPES, rmsnorm_problem(rounding), rmsnorm_canonical(rounding), rmsnorm_make,
                  rmsnorm_call, rmsnorm_reference, rmsnorm_errors(), grad_scale=rmsnorm_grad_scale)


def _activation_spec(name: str, problem, make, call, reference, ltx, gated, errors) -> OpSpec:
    return OpSpec(name, name, ALL_DTYPES, problem, activation_canonical(ltx, gated), make, call, reference, errors)


def _rope_axes_spec(name: str, three_d: bool) -> OpSpec:
    return OpSpec(name, name, ALL_DTYPES, rope_axes_problem(three_d), rope_axes_canonical(three_d),
                  rope_axes_make(three_d), rope_axes_call, rope_axes_reference, rope_axes_errors(three_d), main="q",
                  reference_at=rope_axes_reference_at)



# --- fp8: e4m3 rows with one float32 scale per row ---------------------------------------------------

FP8_MAX_WORDS = 512  # drawn rows: up to 8192 elements, within every dtype's limit (float32: 8192)
FP8_TOLERANCE = {BF16: 1.0, F16: 1.0, F32: 1.0}  # the bound is in each Expect's scale (fp8_expect)


def fp8_width(pick: Pick) -> int:
    """A row width the fp8 ops take: a multiple of 16 (torch._scaled_mm's K)."""
    return 16 * pick.choice((1, 2, 3, 96, 128, 192, 256, pick.integer(1, FP8_MAX_WORDS)))


def fp8_canonical(size: str, path: str) -> Optional[dict]:
    """One path (16-byte words; misaligned inputs are copied): no fallback problem."""
    if path == "fallback":
        return None
    return fixed_rows(size, path)


def fp8_expect(v: torch.Tensor, computed: float | torch.Tensor = 0.0) -> Expect:
    """e4m3 of the float64 rows ``v`` with scale amax / 448: within half an e4m3 step of each element
    (2^-4 relative; 2^-10 of the scale for subnormals), plus float32's error of the row's computation
    (``computed``: where it exceeds 1e-5 of the row's amax, as a LayerNorm of a near-constant row)."""
    amax = v.abs().amax(-1, keepdim=True) if v.numel() else v.abs()
    # 0.08 = 2^-4 and a margin for an input rounded one ulp apart (the seam's residual)
    return Expect(v, 0.08 * v.abs() + amax * (2.0 ** -10 / 448 + 1e-5) + computed, torch.float32)


def fp8_errors(extra: Tuple[BadCall, ...] = (), rows_op: bool = False) -> Tuple[BadCall, ...]:
    """The fp8 ops' shared rejections; ``rows_op`` (the norms and the seam) check the row width after
    the device."""
    return (
        BadCall("`x` on the CPU", "device", RuntimeError, "must be a CUDA tensor", arg="x", move=True),
        BadCall("float64 x", "dtype", TypeError, "supported dtypes are torch.bfloat16", arg="x",
                replace=lambda a: a["x"].double(), before_device=True),
        BadCall("a row of 16k + 8 elements", "shape", RuntimeError, "must be a multiple of 16", arg="x",
                replace=lambda a: torch.ones(*a["x"].shape[:-1], a["x"].shape[-1] + 8, dtype=a["x"].dtype,
                                             device=a["x"].device), before_device=not rows_op),
    ) + extra


def fp8_rows_problem(pick: Pick) -> dict:
    return {"shape": activation_shape(pick, fp8_width(pick)), "x_layout": layout(pick, ANY_LAYOUT)}


def quantize_fp8_call(k, a: Args):
    return (k.quantize_fp8(a["x"]).dequantize(),)


def gelu_tanh_fp8_call(k, a: Args):
    return (k.gelu_tanh_fp8(a["x"]).dequantize(),)


def fp8_norm_problem(summed: bool) -> Callable[[Pick], dict]:
    def draw(pick: Pick) -> dict:
        p = fused_common(pick, row_shape(pick, fp8_width(pick)))
        p.update(weight=pick.boolean() and not summed, scale=mod_shape(pick, p["shape"]),
                 shift=pick.choice((None, mod_shape(pick, p["shape"]))), weight_layout=layout(pick, ANY_LAYOUT),
                 scale_layout=layout(pick, BROADCAST), shift_layout=layout(pick, BROADCAST))
        if summed:
            p.update(gate=pick.choice((None, mod_shape(pick, p["shape"]))), y_layout=layout(pick, ANY_LAYOUT),
                     gate_layout=layout(pick, BROADCAST))
        return p
    return draw


def fp8_norm_canonical(summed: bool) -> Callable[[str, str], Optional[dict]]:
    def fixed(size: str, path: str) -> Optional[dict]:
        if path == "fallback":
            return None
        extra = {"gate": None, "y_layout": CONTIGUOUS, "gate_layout": CONTIGUOUS} if summed else {}
        return fused_canonical(size, path, 1e-6, lambda b, d: {
            "weight": False, "scale": (b, 1, d), "shift": (b, 1, d), "weight_layout": CONTIGUOUS,
            "scale_layout": CONTIGUOUS, "shift_layout": CONTIGUOUS, **extra})
    return fixed


def fp8_norm_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    a = adaln_make(p, dtype, arena)
    if "y_layout" in p:
        a.update(y=arena.tensor(p["shape"], dtype, p["y_layout"]), gate=modulation(p, "gate", dtype, arena, VALUES))
    return a


def fp8_residual_make(p: dict, dtype: torch.dtype, arena: Arena) -> Args:
    """gated_residual_fp8's arguments: x, y and the gate (the seam's problem without its norm)."""
    return {"x": arena.tensor(p["shape"], dtype, p["x_layout"]), "y": arena.tensor(p["shape"], dtype, p["y_layout"]),
            "gate": modulation(p, "gate", dtype, arena, VALUES)}


def adaln_rmsnorm_fp8_call(k, a: Args):
    return (k.adaln_rmsnorm_fp8(a["x"], a["weight"], a["scale"], a["shift"], a["eps"]).dequantize(),)


def adaln_rmsnorm_fp8_reference(a: Args) -> List[Expect]:
    x = a["x"]
    _, n = rms64(x, a["weight"], a["eps"])
    return [fp8_expect(modulate64(x, n, a["scale"], a["shift"])[0])]


def eager_residual64(x: torch.Tensor, y: torch.Tensor, gate) -> torch.Tensor:
    """x + y * gate as the model rounds it (the fp8 producers' one rounding): the product to x's dtype
    when the gate is in x's dtype, then the sum."""
    g = rows_of(gate, x)
    yg = y.double() if g is None else y.double() * g
    if gate is not None and gate.dtype == x.dtype:
        yg = yg.to(x.dtype).double()
    return (x.double() + yg).to(x.dtype).double()


def gated_residual_rmsnorm_fp8_call(k, a: Args):
    rows, x_new = k.gated_residual_rmsnorm_fp8(a["x"], a["y"], a["gate"], a["scale"], a["shift"], a["eps"])
    return rows.dequantize(), x_new


def gated_residual_rmsnorm_fp8_reference(a: Args) -> List[Expect]:
    x = a["x"]
    h64, mag = gated_sum64(x, a["y"], a["gate"])
    _, n = rms64(eager_residual64(x, a["y"], a["gate"]), None, a["eps"])  # the residual the model normalises
    return [fp8_expect(modulate64(x, n, a["scale"], a["shift"])[0]), Expect(h64, 2.0 ** -7 * mag, x.dtype)]


def gated_residual_fp8_call(k, a: Args):
    rows, x_new = k.gated_residual_fp8(a["x"], a["y"], a["gate"])
    return rows.dequantize(), x_new


def gated_residual_fp8_reference(a: Args) -> List[Expect]:
    x = a["x"]
    h64, mag = gated_sum64(x, a["y"], a["gate"])
    return [fp8_expect(eager_residual64(x, a["y"], a["gate"])), Expect(h64, 2.0 ** -7 * mag, x.dtype)]


def fp8_ln_problem(summed: bool) -> Callable[[Pick], dict]:
    """adaln_layernorm_fp8 / gated_residual_layernorm_fp8: the bf16 ops' problems at fp8 row widths."""
    return lambda pick: (seam_ln_problem if summed else adaln_ln_problem)(pick, fp8_width(pick))


def fp8_ln_canonical(summed: bool) -> Callable[[str, str], Optional[dict]]:
    canonical = seam_ln_canonical if summed else adaln_ln_canonical
    return lambda size, path: None if path == "fallback" else canonical(size, path)


def adaln_layernorm_fp8_call(k, a: Args):
    return (k.adaln_layernorm_fp8(a["x"], a["scale"], a["shift"], a["eps"], weight=a["weight"],
                                  bias=a["bias"]).dequantize(),)


def adaln_layernorm_fp8_reference(a: Args) -> List[Expect]:
    x = a["x"]
    n, n_mag = ln64(x, a["weight"], a["bias"], a["eps"])
    out, mag = ln_modulate64(x, n, n_mag, a["scale"], a["shift"])
    return [fp8_expect(out, 2.0 ** -18 * mag)]


def gated_residual_layernorm_fp8_call(k, a: Args):
    rows, x_new = k.gated_residual_layernorm_fp8(a["x"], a["y"], a["gate"], a["eps"], weight=a["weight"],
                                                 bias=a["bias"], scale=a["scale"], shift=a["shift"])
    return rows.dequantize(), x_new


def gated_residual_layernorm_fp8_reference(a: Args) -> List[Expect]:
    x = a["x"]
    h64, mag = gated_sum64(x, a["y"], a["gate"])
    n, n_mag = ln64(eager_residual64(x, a["y"], a["gate"]), a["weight"], a["bias"], a["eps"])
    out, out_mag = ln_modulate64(x, n, n_mag, a["scale"], a["shift"]) if a["scale"] is not None else (n, n_mag)
    return [fp8_expect(out, 2.0 ** -18 * out_mag), Expect(h64, 2.0 ** -7 * mag, x.dtype)]


def fp8_norm_errors(summed: bool) -> Tuple[BadCall, ...]:
    extra = (
        moved("scale", "`scale` is on cpu"),
        BadCall("scale that does not broadcast", "shape", RuntimeError, "does not broadcast", arg="scale",
                replace=lambda a: torch.ones(a["x"].shape[-1] + 1, dtype=a["scale"].dtype, device=a["scale"].device)),
        BadCall("scale of the other half dtype", "dtype", TypeError, "`scale` has dtype", arg="scale",
                replace=lambda a: a["scale"].to(other_half(a["x"].dtype))),
        BadCall("4-D x", "shape", RuntimeError, "reshape it first", arg="x", replace=lambda a: a["x"][None],
                before_device=True),
    )
    if summed:
        extra += (BadCall("y one row short", "shape", RuntimeError, "`y` has shape", arg="y",
                          replace=lambda a: a["y"][..., :-1, :]),)
    return fp8_errors(extra, rows_op=True)


OPS: Tuple[OpSpec, ...] = (
    _rmsnorm_spec("rmsnorm", "torch"),
    _rmsnorm_spec("rmsnorm_diffusers", "diffusers"),
    OpSpec("rmsnorm_residual", "rmsnorm_residual", ALL_DTYPES, residual_problem, residual_canonical, residual_make,
           residual_call, residual_reference, fused_errors((
               moved("residual", "`residual` is on cpu"),
               other_dtype("residual"),
               one_short("residual"),
               BadCall("float32 weight", "dtype", TypeError, "`weight` has dtype Float", arg="weight",
                       replace=lambda a: a["weight"].float()),
               BadCall("unknown rounding", "value", ValueError, "`rounding` must be one of", arg="rounding",
                       replace=lambda a: "bogus", before_device=True),
               BadCall("raw op with a strided out", "stride", RuntimeError, "`out` must have a contiguous last dim",
                       invoke=lambda k, a: k.ops.rmsnorm_residual(strided_like(a["x"]), torch.empty_like(a["x"]),
                                                                  a["x"], a["residual"], a["weight"], a["eps"],
                                                                  False)),
           ), mod=None)),
    OpSpec("adaln_rmsnorm", "adaln_rmsnorm", ALL_DTYPES, adaln_problem, adaln_canonical, adaln_make, adaln_call,
           adaln_reference, fused_errors((
               one_short("weight"),
               BadCall("scale and shift of different dtypes", "dtype", TypeError, "must share one dtype", arg="shift",
                       replace=lambda a: a["shift"].float()),
               BadCall("negative eps", "value", RuntimeError, "`eps` must be >= 0", arg="eps", replace=lambda a: -1.0),
               overlapping_out("adaln_rmsnorm", adaln_args),
           ))),
    OpSpec("gated_residual", "gated_residual", ALL_DTYPES, gated_problem, gated_canonical, gated_make, gated_call,
           gated_reference, fused_errors((
               moved("y", "`y` is on cpu"),
               other_dtype("y"),
               one_short("y"),
               BadCall("in place into an expanded x", "stride", RuntimeError, "internal overlap",
                       invoke=lambda k, a: k.gated_residual(a["x"][..., :1, :].expand_as(a["x"]), a["y"], a["gate"],
                                                            inplace=True)),
           ), mod="gate")),
    OpSpec("gated_residual_rmsnorm", "gated_residual_rmsnorm", ALL_DTYPES, seam_problem, seam_canonical, seam_make,
           seam_call, seam_reference, fused_errors((
               moved("y", "`y` is on cpu"),
               BadCall("gate that does not broadcast", "shape", RuntimeError, "does not broadcast", arg="gate",
                       replace=lambda a: a["gate"][..., :-1]),
               BadCall("gate and scale of different dtypes", "dtype", TypeError, "must share one dtype", arg="gate",
                       replace=lambda a: a["gate"].float()),
               overlapping_out("gated_residual_rmsnorm", seam_args),
           ))),
    OpSpec("residual_tanh_gated_rmsnorm", "residual_tanh_gated_rmsnorm", ALL_DTYPES, tanh_problem, tanh_canonical,
           tanh_make, tanh_call, tanh_reference, (
               BadCall("`x_res` on the CPU", "device", RuntimeError, "`x_res` must be a CUDA tensor", arg="x_res",
                       move=True),
               moved("x", "is on cpu"),  # `out`, allocated like x, is checked first
               moved("gate", "`gate` is on cpu"),
               BadCall("gate of the other half dtype", "dtype", TypeError, "`gate` has dtype", arg="gate",
                       replace=lambda a: a["gate"].to(other_half(a["x"].dtype))),
               BadCall("x one short", "shape", RuntimeError, "has shape", arg="x",
                       replace=lambda a: drop_last(a["x"])),
               BadCall("4-D x_res", "shape", RuntimeError, "reshape it first", arg="x_res",
                       replace=lambda a: a["x_res"][None], before_device=True),
               BadCall("raw op with a strided out", "stride", RuntimeError, "`out` must have a contiguous last dim",
                       invoke=lambda k, a: k.ops.residual_tanh_gated_rmsnorm(strided_like(a["x"]), a["x"], a["x_res"],
                                                                             a["gate"], a["eps"], True)),
           )),
    OpSpec("modulated_rmsnorm", "modulated_rmsnorm", ALL_DTYPES, modulated_problem, modulated_canonical,
           modulated_make, modulated_call, modulated_reference, fused_errors((
               BadCall("negative eps", "value", RuntimeError, "`eps` must be >= 0", arg="eps", replace=lambda a: -1.0),
               BadCall("raw op with a strided out", "stride", RuntimeError, "`out` must have a contiguous last dim",
                       invoke=lambda k, a: k.ops.modulated_rmsnorm(strided_like(a["x"]), a["x"], a["scale"],
                                                                   a["eps"], 1.0)),
           ))),
    OpSpec("layernorm", "layernorm", ALL_DTYPES, ln_problem, ln_canonical, ln_make, ln_call, ln_reference, (
        BadCall("`x` on the CPU", "device", RuntimeError, "`x` must be a CUDA tensor", arg="x", move=True),
        BadCall("float64 x", "dtype", TypeError, "supported dtypes are torch.bfloat16", arg="x",
                replace=lambda a: a["x"].double(), before_device=True),
        BadCall("0-d x", "shape", RuntimeError, "at least one dimension", arg="x",
                replace=lambda a: a["x"].reshape(-1)[0], before_device=True),
        *affine_errors(),
        BadCall("raw op with a strided out", "stride", RuntimeError, "`out` must have a contiguous last dim",
                invoke=lambda k, a: k.ops.layernorm(*ln_raw(a, strided_like(a["x"])))),
        overlapping_out("layernorm", ln_raw),
    )),
    OpSpec("adaln_layernorm", "adaln_layernorm", ALL_DTYPES, adaln_ln_problem, adaln_ln_canonical, adaln_ln_make,
           adaln_ln_call, adaln_ln_reference, fused_errors((
               *affine_errors(),
               BadCall("scale and shift of different dtypes", "dtype", TypeError, "must share one dtype", arg="shift",
                       replace=lambda a: a["shift"].float()),
               BadCall("raw op with a strided out", "stride", RuntimeError, "`out` must have a contiguous last dim",
                       invoke=lambda k, a: k.ops.adaln_layernorm(*adaln_ln_raw(a, strided_like(a["x"])))),
               overlapping_out("adaln_layernorm", adaln_ln_raw),
           ))),
    OpSpec("gated_residual_layernorm", "gated_residual_layernorm", ALL_DTYPES, seam_ln_problem, seam_ln_canonical,
           seam_ln_make, seam_ln_call, seam_ln_reference, fused_errors((
               moved("y", "`y` is on cpu"),
               other_dtype("y"),
               one_short("y"),
               *affine_errors(),
               BadCall("gate and scale of different dtypes", "dtype", TypeError, "must share one dtype", arg="scale",
                       replace=lambda a: a["scale"].float()),
               BadCall("shift without scale", "value", RuntimeError, "`shift` was given without `scale`",
                       arg="scale", replace=lambda a: None, before_device=True),
               BadCall("raw op with out as x_out", "stride", RuntimeError, "must be different tensors",
                       invoke=lambda k, a: k.ops.gated_residual_layernorm(*seam_ln_raw(a, *(torch.empty_like(a["x"]),)
                                                                                        * 2))),
               overlapping_out("gated_residual_layernorm", seam_ln_raw),
           ), mod="gate")),
    OpSpec("pixel_norm", "pixel_norm", ALL_DTYPES, pixel_norm_problem, pixel_norm_canonical, pixel_norm_make,
           pixel_norm_call, pixel_norm_reference, (
               moved("x", "`x` must be a CUDA tensor"),
               BadCall("float64 x", "dtype", TypeError, "supported dtypes are torch.bfloat16", arg="x",
                       replace=lambda a: a["x"].double(), before_device=True),
               BadCall("1-D x", "shape", RuntimeError, "`x` must have at least 2 dims", arg="x",
                       replace=lambda a: a["x"].reshape(-1), before_device=True),
               BadCall("dim out of range", "value", IndexError, "`dim` is out of range", arg="dim",
                       replace=lambda a: a["x"].dim(), before_device=True),
               BadCall("out of another dtype", "dtype", TypeError, "`out` has dtype", arg="out",
                       replace=lambda a: torch.empty(a["x"].shape, dtype=F32 if a["x"].dtype != F32 else BF16,
                                                     device=a["x"].device), before_device=True),
               BadCall("non-contiguous out", "stride", RuntimeError, "`out` must be contiguous", arg="out",
                       replace=lambda a: strided_like(a["x"]), before_device=True),
               BadCall("negative eps", "value", RuntimeError, "`eps` must be >= 0", arg="eps", replace=lambda a: -1.0,
                       before_device=True),
               BadCall("unknown rounding", "value", ValueError, "`rounding` must be one of", arg="rounding",
                       replace=lambda a: "bogus", before_device=True),
           ), big_axis=2),
    OpSpec("inplace_add", "inplace_add", ALL_DTYPES, inplace_add_problem, inplace_add_canonical, inplace_add_make,
           inplace_add_call, inplace_add_reference, (
               moved("x", "`x` must be a CUDA tensor"),
               moved("y", "`y` is on cpu"),
               BadCall("y of the other half dtype", "dtype", TypeError, "`y` has dtype", arg="y",
                       replace=lambda a: a["y"].to(other_half(a["x"].dtype)), before_device=True),
               BadCall("y that does not broadcast", "shape", RuntimeError, "cannot be broadcast", arg="y",
                       replace=lambda a: torch.ones(a["x"].shape[-1] + 1, dtype=a["y"].dtype, device=a["y"].device),
                       before_device=True),
               BadCall("expanded x", "stride", RuntimeError, "internal overlap", arg="x",
                       replace=lambda a: a["x"][:1].expand_as(a["x"]), before_device=True),
               BadCall("x of 9 dims", "shape", RuntimeError, "at most 8 are supported", arg="x",
                       replace=lambda a: a["x"].reshape((1,) * (9 - a["x"].dim()) + tuple(a["x"].shape)),
                       before_device=True),
           )),
    _activation_spec("gelu_tanh", gelu_problem, gelu_make, lambda k, a: (k.gelu_tanh(a["x"]),), gelu_reference,
                     (2, 2688, 8192), False, (
                         BadCall("`x` on the CPU", "device", RuntimeError, "`x` must be a CUDA tensor", arg="x",
                                 move=True),
                         BadCall("float64 x", "dtype", TypeError, "`x` has dtype Double", arg="x",
                                 replace=lambda a: a["x"].double(), before_device=True),
                         BadCall("0-d x", "shape", RuntimeError, "at least one dimension", arg="x",
                                 replace=lambda a: a["x"].reshape(-1)[0], before_device=True),
                         BadCall("raw op with a strided out", "stride", RuntimeError, "`out` must be contiguous",
                                 invoke=lambda k, a: k.ops.gelu_tanh(strided_like(a["x"]), a["x"], False)),
                     )),
    _activation_spec("geglu", glu_problem, glu_make,
                     lambda k, a: (k.geglu(a["x"], a["approximate"], gelu_half=a["half"]),),
                     glu_reference(geglu_act), (2, 2688, 16384), True, glu_errors("geglu")),
    _activation_spec("swiglu", glu_problem, glu_make, lambda k, a: (k.swiglu(a["x"], silu_half=a["half"]),),
                     glu_reference(lambda a, t: torch.nn.functional.silu(t)), (2, 2048, 16384), True,
                     glu_errors("swiglu")),
    OpSpec("head_gate", "head_gate", ALL_DTYPES, head_gate_problem, head_gate_canonical, head_gate_make,
           head_gate_call, head_gate_reference, head_gate_errors(), grad_scale=head_gate_grad_scale),
    OpSpec("linear_gelu", "linear_gelu", ALL_DTYPES, linear_gelu_problem, linear_gelu_canonical, linear_gelu_make,
           lambda k, a: (k.linear_gelu(a["x"], a["weight"], a["bias"]),), linear_gelu_reference, (
               BadCall("`x` on the CPU", "device", RuntimeError, "`x` must be a CUDA tensor", arg="x", move=True),
               BadCall("`weight` on the CPU", "device", RuntimeError, None, arg="weight", move=True),
               BadCall("weight of another width", "shape", RuntimeError, "do not make x @ weight.T + bias",
                       arg="weight", replace=lambda a: drop_last(a["weight"])),
               BadCall("bias one short", "shape", RuntimeError, "do not make x @ weight.T + bias", arg="bias",
                       replace=lambda a: drop_last(a["bias"])),
               BadCall("weight of another dtype", "dtype", RuntimeError, None, arg="weight",
                       replace=lambda a: a["weight"].double()),
           ),
           # cuBLAS may reduce in reduced precision (split-K) or TF32: errors relative to the terms
           tolerance={BF16: 2.0 ** -4, F16: 2.0 ** -7, F32: 2.0 ** -9}, deterministic=False,
           grad_scale=linear_gelu_grad_scale),
    OpSpec("apply_rotary_emb", "apply_rotary_emb", ALL_DTYPES, rotary_problem, rotary_canonical, rotary_make,
           rotary_call, rotary_reference, (
               BadCall("`x` on the CPU", "device", RuntimeError, "`x` must be a CUDA tensor", arg="x", move=True),
               moved("cos", "`cos` is on cpu"),
               BadCall("bfloat16 tables", "dtype", TypeError, "must be torch.float32", arg="cos",
                       replace=lambda a: a["cos"].bfloat16()),
               BadCall("float64 x", "dtype", TypeError, "`x` has dtype Double", arg="x",
                       replace=lambda a: a["x"].double(), before_device=True),
               BadCall("2-D x", "shape", RuntimeError, "`x` must be [batch, seq, dim]", arg="x",
                       replace=lambda a: a["x"][0], before_device=True),
               BadCall("table one token short", "shape", RuntimeError, "`cos` has shape", arg="cos",
                       replace=lambda a: a["cos"][:, :-1]),
               BadCall("out with a strided last dim", "stride", RuntimeError, "`out` must have a contiguous last dim",
                       arg="out", replace=lambda a: strided_like(a["x"])),
           ), grad_args=("x",)),
    OpSpec("qk_rmsnorm_rope", "qk_rmsnorm_rope", ALL_DTYPES, qk_problem, qk_canonical, qk_make, qk_call,
           qk_reference, (
               BadCall("`q` on the CPU", "device", RuntimeError, "`q` must be a CUDA tensor", arg="q", move=True),
               moved("k", "`k` is on cpu"),
               moved("cos", "`cos` is on cpu"),
               other_dtype("k", like="q"),
               BadCall("bfloat16 tables", "dtype", TypeError, "must be torch.float32", arg="cos",
                       replace=lambda a: a["cos"].bfloat16()),
               BadCall("diffusers rounding with a float32 weight", "dtype", TypeError,
                       "diffusers rounding with a float32 weight", invoke=lambda k, a: qk_call(
                           k, {**a, "rounding": "diffusers", "q_weight": a["q_weight"].float(),
                               "k_weight": a["k_weight"].float()})),
               BadCall("head_dim that does not divide", "shape", RuntimeError, "`head_dim` is", arg="head_dim",
                       replace=lambda a: a["q"].shape[-1] // 2 + 2),
               BadCall("unknown rotation", "value", ValueError, "`rotation` must be one of", arg="rotation",
                       replace=lambda a: "complex", before_device=True),
               BadCall("2-D q", "shape", RuntimeError, "must be [B, S, D] or [B, S, H, Dh]", arg="q",
                       replace=lambda a: a["q"][0], before_device=True),
               BadCall("raw op with a strided q_out", "stride", RuntimeError,
                       "`q_out` must have a contiguous last dim",
                       invoke=lambda k, a: k.ops.qk_rmsnorm_rope(*qk_raw_args(a, strided_like(a["q"]),
                                                                              torch.empty_like(a["k"])))),
               BadCall("raw op with q_out as k_out", "stride", RuntimeError, "are the same memory",
                       invoke=lambda k, a: k.ops.qk_rmsnorm_rope(*qk_raw_args(a, *(torch.empty_like(a["q"]),) * 2))),
           ), main="q", grad_args=("q", "k", "q_weight", "k_weight")),
    _rope_axes_spec("rope_3d", True),
    _rope_axes_spec("rope_1d", False),
    OpSpec("quantize_fp8", "quantize_fp8", ALL_DTYPES, fp8_rows_problem, fp8_canonical,
           gelu_make, quantize_fp8_call, lambda a: [fp8_expect(a["x"].double())], fp8_errors(),
           tolerance=dict(FP8_TOLERANCE)),
    OpSpec("gelu_tanh_fp8", "gelu_tanh_fp8", (BF16, F16), fp8_rows_problem, fp8_canonical,
           gelu_make, gelu_tanh_fp8_call, lambda a: [fp8_expect(gelu_tanh64(a["x"]))], fp8_errors(),
           tolerance=dict(FP8_TOLERANCE)),
    OpSpec("adaln_rmsnorm_fp8", "adaln_rmsnorm_fp8", (BF16, F16), fp8_norm_problem(False), fp8_norm_canonical(False),
           fp8_norm_make, adaln_rmsnorm_fp8_call, adaln_rmsnorm_fp8_reference, fp8_norm_errors(False),
           tolerance=dict(FP8_TOLERANCE)),
    OpSpec("gated_residual_rmsnorm_fp8", "gated_residual_rmsnorm_fp8", (BF16, F16), fp8_norm_problem(True),
           fp8_norm_canonical(True), fp8_norm_make, gated_residual_rmsnorm_fp8_call,
           gated_residual_rmsnorm_fp8_reference, fp8_norm_errors(True), tolerance=dict(FP8_TOLERANCE)),
    OpSpec("gated_residual_fp8", "gated_residual_fp8", (BF16, F16), fp8_norm_problem(True), fp8_norm_canonical(True),
           fp8_residual_make, gated_residual_fp8_call, gated_residual_fp8_reference, fp8_errors(
               (BadCall("y one row short", "shape", RuntimeError, "`y` has shape", arg="y",
                        replace=lambda a: a["y"][..., :-1, :]),
                BadCall("4-D x", "shape", RuntimeError, "reshape it first", arg="x", replace=lambda a: a["x"][None],
                        before_device=True)), rows_op=True),
           tolerance=dict(FP8_TOLERANCE)),
    OpSpec("adaln_layernorm_fp8", "adaln_layernorm_fp8", (BF16, F16), fp8_ln_problem(False), fp8_ln_canonical(False),
           adaln_ln_make, adaln_layernorm_fp8_call, adaln_layernorm_fp8_reference,
           fp8_norm_errors(False) + affine_errors(), tolerance=dict(FP8_TOLERANCE)),
    OpSpec("gated_residual_layernorm_fp8", "gated_residual_layernorm_fp8", (BF16, F16), fp8_ln_problem(True),
           fp8_ln_canonical(True), seam_ln_make, gated_residual_layernorm_fp8_call,
           gated_residual_layernorm_fp8_reference, fp8_norm_errors(True) + affine_errors(),
           tolerance=dict(FP8_TOLERANCE)),
)

BY_NAME: Dict[str, OpSpec] = {spec.name: spec for spec in OPS}

# Exported names that are not ops: table builders, helpers and the error classes.
# linear_fp8 (and Fp8Linear) are torch._scaled_mm on operands the fp8 ops make: tests/test_fp8_gpu.py.
NOT_OPS = frozenset({"ltx_rope_cos_sin", "rope_3d_split", "kernel_info", "layers", "vae", "ops",
                     "add_op_namespace_prefix", "UnsupportedDeviceError", "NoBackwardError", "DIFFERENTIABLE",
                     "Fp8Rows", "Fp8Linear", "linear_fp8"})
