"""Experiment (issue 3): the smallest row kernels of the fused norm family (norm_rows.cu: one word of
each row stream per thread, 1, 2 or 4 rows per block, no loop, no prefetch; built here with nvcc,
called through ctypes) against the library's kernels, torch.compile of the eager chains and Liger,
in one process, two rounds, at the issue's four shapes: is what the library's row kernels lack
on the H200 in their layout (persistent grid, next-row prefetch) or in their arithmetic?
Results in benchmarks/results/experiments/.

    python3 benchmarks/experiments/norm_rows.py     (GPU machine; JSON to $OUT or /tmp)
"""
import ctypes
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.common import copy_tbps, load_kernel, rotating_graph_us  # noqa: E402
from benchmarks.experiments import standalone  # noqa: E402
from tests import reference as ref  # noqa: E402

EPS = 1e-6
SHAPES = [(2, 2688, 2048), (2, 8160, 2048), (2, 2688, 4096), (2, 2048, 3072)]
OPS = {0: "rmsnorm_residual", 1: "adaln fast", 2: "adaln exact", 3: "seam fast"}


def build():
    lib, log = standalone.build("norm_rows")
    p = ctypes.c_void_p
    lib.norm_rows_launch.argtypes = [ctypes.c_int, ctypes.c_int, p, p, p, p, p, p, p, p, ctypes.c_int, ctypes.c_int,
                                     ctypes.c_int, ctypes.c_float, p]
    return lib, log


def main():
    (lib, ptxas_log), k = build(), load_kernel()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    ceiling = copy_tbps()
    print(f"copy {ceiling:.2f} TB/s", flush=True)
    bf16 = torch.bfloat16
    results = []

    def minimal(op, rpb):
        def fn(x, y=None, w=None, g=None, s=None, sh=None):
            B, S, D = x.shape
            out = torch.empty_like(x)
            res = torch.empty_like(x) if op in (0, 3) else None
            ptr = lambda t: t.data_ptr() if t is not None else None  # noqa: E731
            rc = lib.norm_rows_launch(op, rpb, ptr(x), ptr(y), ptr(w), ptr(g), ptr(s), ptr(sh), ptr(out), ptr(res),
                                      B * S, S, D, EPS, torch.cuda.current_stream().cuda_stream)
            assert rc == 0, (op, rpb, rc)
            return (out, res) if res is not None else out
        return fn

    for shape in SHAPES:
        B, S, D = shape
        rpbs = [r for r in (1, 2, 4) if ((D // 8 + 31) // 32 * 32) * r <= 1024]

        def rows(i, n):
            g = torch.Generator(device="cuda").manual_seed(i)
            return [torch.randn(shape, generator=g, device="cuda").to(bf16) for _ in range(n)]

        def mods(i, n):
            g = torch.Generator(device="cuda").manual_seed(1000 + i)
            return [(torch.randn((B, 1, D), generator=g, device="cuda") * 0.3).to(bf16) for _ in range(n)]

        w = torch.ones(D, device="cuda", dtype=bf16)
        residual_eager = lambda x, r: (lambda h: (F.rms_norm(h, (D,), w, EPS), h))(x + r)  # noqa: E731
        adaln_eager = lambda x, s, sh: ref.ltx_adaln_eager(x, None, s, sh, EPS)  # noqa: E731

        def seam_eager(x, y, g, s, sh):
            h = ref.gated_residual_eager(x, y, g)
            return ref.ltx_adaln_eager(h, None, s, sh, EPS), h

        cases = {
            "rmsnorm_residual": (4, lambda i: (*rows(i, 2),), {
                "library": lambda x, r: k.rmsnorm_residual(x, r, w, EPS),
                "torch.compile": torch.compile(residual_eager, dynamic=False),
                **{f"minimal {n} row/block": (lambda f: lambda x, r: f(x, r, w))(minimal(0, n)) for n in rpbs}}),
            "adaln fast": (2, lambda i: (*rows(i, 1), *mods(i, 2)), {
                "library": lambda x, s, sh: k.adaln_rmsnorm(x, None, s, sh, EPS, exact_mode=False),
                **{f"minimal {n} row/block": (lambda f: lambda x, s, sh: f(x, s=s, sh=sh))(minimal(1, n))
                   for n in rpbs}}),
            "adaln exact": (2, lambda i: (*rows(i, 1), *mods(i, 2)), {
                "library": lambda x, s, sh: k.adaln_rmsnorm(x, None, s, sh, EPS),
                "torch.compile": torch.compile(adaln_eager, dynamic=False),
                **{f"minimal {n} row/block": (lambda f: lambda x, s, sh: f(x, s=s, sh=sh))(minimal(2, n))
                   for n in rpbs}}),
            "seam fast": (4, lambda i: (*rows(i, 2), *mods(i, 3)), {
                "library": lambda x, y, g, s, sh: k.gated_residual_rmsnorm(x, y, g, s, sh, EPS, exact_mode=False),
                "torch.compile": torch.compile(seam_eager, dynamic=False),
                **{f"minimal {n} row/block": (lambda f: lambda x, y, g, s, sh: f(x, y, g=g, s=s, sh=sh))(minimal(3, n))
                   for n in rpbs}}),
        }
        try:
            from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
            cases["rmsnorm_residual"][2]["Liger"] = (
                lambda x, r: LigerFusedAddRMSNormFunction.apply(x, r, w, EPS, 0.0, "llama", False))
        except Exception as e:  # noqa: BLE001
            print("no Liger:", e)
        for op, (n_rows, make, impls) in cases.items():
            nbytes = n_rows * B * S * D * 2
            args0 = make(0)
            want = impls["library"](*args0)
            want = want if isinstance(want, tuple) else (want,)
            for rnd in range(2):
                for impl, fn in impls.items():
                    got = fn(*args0)
                    got = got if isinstance(got, tuple) else (got,)
                    differ = max(float((a != b).float().mean()) for a, b in zip(got, want))
                    us = rotating_graph_us(fn, make, nbytes)
                    frac = nbytes / us / 1e6 / ceiling
                    print(f"{op:17s} {str(list(shape)):16s} {impl:22s} {us:8.2f} us {100 * frac:6.1f}%  "
                          f"differs from library {100 * differ:.4f}%", flush=True)
                    results.append(dict(op=op, shape=list(shape), impl=impl, round=rnd, us=us, frac=frac,
                                        differ=differ))
    standalone.save("norm_rows", ceiling, results, ptxas_log, 4000)


if __name__ == "__main__":
    main()
