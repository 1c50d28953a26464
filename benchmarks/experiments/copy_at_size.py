"""Experiment: what a plain device-to-device copy reaches at the byte counts of the benchmark rows
that sit below 85% of the copy rate, timed exactly as the rows are (rotating_graph_us: calls back
to back in a CUDA graph, inputs spanning 4x L2). The copy rate the rows are divided by is measured
on 1 GiB with do_bench; a call that moves 40-90 MB pays a ramp-up and a tail the 1 GiB copy hides,
and this says how much of the gap to 85% that is on the machine it runs on.

    python3 benchmarks/experiments/copy_at_size.py     (GPU machine; JSON to $OUT or /tmp)
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import copy_tbps, environment, rotating_graph_us  # noqa: E402
from benchmarks.experiments import standalone  # noqa: E402

# (row, bytes read + written by the op). bf16 = 2 bytes.
ROWS = [
    ("rope_3d [2,2688,32,64] q+k in place", 2 * 2 * (2 * 2688 * 32 * 64) * 2),
    ("pixel_norm [2,512,7,32,48]", 2 * (2 * 512 * 7 * 32 * 48) * 2),
    ("pixel_norm [1,256,13,64,96]", 2 * (256 * 13 * 64 * 96) * 2),
    ("inplace_add [2,512,7,32,48] += [512,1,1,1]", 2 * (2 * 512 * 7 * 32 * 48) * 2),
    ("adaln_rmsnorm [2,2048,3072]", 2 * (2 * 2048 * 3072) * 2),
    ("modulated_rmsnorm [2,8160,2048]", 2 * (2 * 8160 * 2048) * 2),
    ("residual_tanh_gated_rmsnorm [1,2048,3072]", 3 * (2048 * 3072) * 2),
]


def copy_us(nbytes: int) -> float:
    elems = nbytes // 4  # half the bytes are read, half written; 2 bytes per element

    def make_args(i):
        src = torch.randn(elems, device="cuda").bfloat16()
        return src, torch.empty_like(src)

    return rotating_graph_us(lambda src, dst: dst.copy_(src), make_args, nbytes)


def main():
    env = environment()
    ceiling = copy_tbps()
    print(f"{env['device']}  torch {env['torch']}  copy (1 GiB, do_bench) {ceiling:.2f} TB/s", flush=True)
    rows = []
    for name, nbytes in ROWS:
        us = copy_us(nbytes)
        tbps = nbytes / (us * 1e-6) / 1e12
        rows.append({"row": name, "bytes": nbytes, "copy_us": round(us, 2), "frac_copy": round(tbps / ceiling, 3)})
        print(f"  {name:45s} {nbytes / 1e6:7.1f} MB  copy_ {us:8.2f} us  {tbps / ceiling:6.1%} of the 1 GiB rate",
              flush=True)
    print(f"wrote {standalone.save('copy_at_size', round(ceiling, 3), rows)}")


if __name__ == "__main__":
    main()
