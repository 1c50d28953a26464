"""3-D / 1-D RoPE benchmark (issue 4, item 3): `rope_3d` (Wan's time/height/width
split of the head dim, angles computed in the kernel, q and k rotated in place)
against the eager rotation diffusers' `WanAttnProcessor` runs (its
`apply_rotary_emb` with float32 `WanRotaryPosEmbed`-layout tables [1, S, 1, D],
out of place, bf16 q/k) and torch.compile of it; `rope_1d` against the same
code with 1-D tables. Shapes, q and k [B, S, H, D] bf16:

  Wan 2.1 1.3B 480p  81 frames at 832x480 -> latent 21x60x104, patch (1,2,2): 21x30x52 = 32760 tokens, 12 x 128
  Wan 2.1 14B 480p   same grid, 40 heads x 128
  Wan 2.1 14B 720p   81 frames at 1280x720 -> 21x45x80 = 75600 tokens, 40 x 128
  LTX-like           [2, 2688, 32, 64]: 49 frames at 512x768 -> 7x16x24 tokens, 2B head layout, batch 2 (CFG)

Bytes: q and k each read once and written once, the floor for any
implementation (the tables the baselines also read are not counted). Timing as
in bench_rmsnorm.py.

Backward rows ("rope_3d backward", issue 36; ltx_dev/bench/backward.py) at Wan 1.3B [2, 32760, 12, 128]
and LTX-Video 2B's layout [2, 2688, 32, 64]: our rotation by -angle against eager autograd of diffusers'
Wan rotation, torch.compile's backward, and Liger's RoPE, which is rotate-half only (a different pair
layout, so a reference for the speed of the same bytes, not the same result), on the [B, H, S, D] view
of token-major storage it takes. Bytes (the floor): dq and dk read, grads of q and k written (bf16).

    python3 -m benchmarks.bench_rope_axes [--out DIR] [--quick]   (--help: every option)
"""

from __future__ import annotations

import importlib

import torch

from ltx_dev.bench.harness import measure, save, start

# the eager rotation of diffusers' WanAttnProcessor, written out once (the tests check it against diffusers)
from ltx_dev.reference.rope_axes import diffusers_wan_rotary_apply as wan_apply_rotary_emb

from ltx_dev.bench.backward import liger_rope, measure_backward

# (name, batch, (frames, height, width), heads, head_dim)
SHAPES = [("Wan 1.3B 480p", 1, (21, 30, 52), 12, 128), ("Wan 14B 480p", 1, (21, 30, 52), 40, 128),
          ("Wan 14B 720p", 1, (21, 45, 80), 40, 128), ("LTX-like", 2, (7, 16, 24), 32, 64)]


def tables(positions, parts, theta=10000.0):
    """float32 (cos, sin) [1, S, 1, D] in WanRotaryPosEmbed's layout (each angle repeated
    for its pair), built in float64 as diffusers does: positions [S, n_axes], parts = channels per axis."""
    angles = []
    for axis, d in enumerate(parts):
        freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device="cuda") / d)
        angles.append(positions[:, axis : axis + 1].double() * freqs)
    a = torch.cat(angles, dim=1).repeat_interleave(2, dim=1)
    return a.cos().float()[None, :, None, :], a.sin().float()[None, :, None, :]


def grid_positions(frames, height, width):
    axes = [torch.arange(n, device="cuda") for n in (frames, height, width)]
    return torch.stack([g.flatten() for g in torch.meshgrid(*axes, indexing="ij")], dim=1)


def main() -> None:
    args, kernel, env, ceiling = start(__doc__, "one shape")
    ra = importlib.import_module(kernel.__name__ + ".rope_axes")  # whether or not __init__ re-exports it
    rows: list[dict] = []

    def eager(q, k, cos, sin):
        return wan_apply_rotary_emb(q, cos, sin), wan_apply_rotary_emb(k, cos, sin)

    compiled = torch.compile(eager, dynamic=False)
    for name, batch, (frames, height, width), heads, head_dim in SHAPES[: 1 if args.quick else None]:
        seq = frames * height * width
        hw = 2 * (head_dim // 6)
        cos, sin = tables(grid_positions(frames, height, width), (head_dim - 2 * hw, hw, hw))
        cos1, sin1 = tables(torch.arange(seq, device="cuda")[:, None], (head_dim,))
        shape = (batch, seq, heads, head_dim)
        nbytes = 2 * 2 * 2 * batch * seq * heads * head_dim  # q and k, read + write, bf16

        def make_args(i, shape=shape):
            return (torch.randn(shape, device="cuda").bfloat16(), torch.randn(shape, device="cuda").bfloat16())

        print(f"{name}: {list(shape)}, grid {frames}x{height}x{width}", flush=True)
        impls = {"ltx_kernels": lambda q, k, g=(frames, height, width): ra.rope_3d(q, k, *g),
                 "eager (diffusers Wan)": lambda q, k, c=cos, s=sin: eager(q, k, c, s),
                 "torch.compile(diffusers Wan)": lambda q, k, c=cos, s=sin: compiled(q, k, c, s)}
        measure(rows, ceiling, "rope_3d", shape, impls, make_args, nbytes)
        if name == "LTX-like" or args.quick:
            impls = {"ltx_kernels": lambda q, k: ra.rope_1d(q, k),
                     "eager (1-D tables)": lambda q, k, c=cos1, s=sin1: eager(q, k, c, s),
                     "torch.compile(1-D tables)": lambda q, k, c=cos1, s=sin1: compiled(q, k, c, s)}
            measure(rows, ceiling, "rope_1d", shape, impls, make_args, nbytes)
    backward_rows(ra, rows, ceiling, eager, compiled)
    save("rope_axes", env, ceiling, rows, args.out)


# (batch, (frames, height, width), heads, head_dim): Wan 1.3B 480p at batch 2, LTX-Video 2B's layout
BACKWARD_SHAPES = [(2, (21, 30, 52), 12, 128), (2, (7, 16, 24), 32, 64)]


def backward_rows(ra, rows, ceiling, eager, compiled) -> None:
    liger = liger_rope()
    for batch, grid, heads, head_dim in BACKWARD_SHAPES:
        seq = grid[0] * grid[1] * grid[2]
        hw = 2 * (head_dim // 6)
        cos, sin = tables(grid_positions(*grid), (head_dim - 2 * hw, hw, hw))
        shape = (batch, seq, heads, head_dim)
        forwards = {"ltx_kernels": lambda q, k, g=grid: ra.rope_3d(q, k, *g),
                    "eager (diffusers Wan)": lambda q, k, c=cos, s=sin: eager(q, k, c, s),
                    "torch.compile(diffusers Wan)": lambda q, k, c=cos, s=sin: compiled(q, k, c, s)}
        nbytes = 2 * 2 * 2 * batch * seq * heads * head_dim  # dq, dk read; grads written; bf16
        measure_backward(rows, ceiling, "rope_3d", shape, forwards,
                         lambda: (torch.randn(shape, device="cuda").bfloat16(),
                                  torch.randn(shape, device="cuda").bfloat16()), nbytes)
        if liger is not None:
            # Liger takes the [B, H, S, D] view of [B, S, H, D] storage (as HF models hold q and k) and
            # [1, S, D] tables in the model dtype; newer versions also return cos and sin (dropped)
            c, s = (t[:, :, 0, :].to(torch.bfloat16).contiguous() for t in (cos, sin))
            try:
                measure_backward(rows, ceiling, "rope_3d", shape,
                                 {"Liger (rotate-half layout)": lambda q, k, c=c, s=s: tuple(
                                     liger(q.transpose(1, 2), k.transpose(1, 2), c, s)[:2])},
                                 lambda: (torch.randn(shape, device="cuda").bfloat16(),
                                          torch.randn(shape, device="cuda").bfloat16()), nbytes)
            except Exception as e:  # noqa: BLE001 - a baseline that fails is reported, not fatal
                print(f"Liger rope backward failed: {e!r}", flush=True)


if __name__ == "__main__":
    main()
