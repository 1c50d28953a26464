"""Experiment (issue 4): thread layouts of the per-head q/k RMSNorm + RoPE kernel (bf16, diffusers
RMSNorm per head of 128, interleaved RoPE with [S, 128] float32 tables), as standalone kernels
(qk_head_layouts.cu, built here with nvcc, called through ctypes). Each layout runs with the math
(checked bitwise against the eager chain) and as a copy of the same words (the layout's own
ceiling), beside a torch copy of the same bytes and the library's op, two rounds, at the issue's
[2, 2688, 32, 128] and Flux's [1, 4608, 24, 128]. Results in benchmarks/results/experiments/.

    python3 benchmarks/experiments/qk_head_layouts.py     (GPU machine; JSON to $OUT or /tmp)
"""
import ctypes
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import copy_tbps, load_kernel, rotating_graph_us  # noqa: E402
from benchmarks.experiments import standalone  # noqa: E402

LAYOUTS = {0: "2w token/block, samples in turn (library)", 1: "2w (token, sample)/block",
           2: "2w (half token, sample)/128-block", 3: "1w (half token, sample)/block",
           4: "2w both samples loaded together", 5: "1w half token/block, samples in turn (v7)",
           6: "2w (token, sample)/block, 4 blocks/SM", 7: "1w (quarter token, sample)/128-block",
           8: "2w token/block, samples in turn, 4 blocks/SM", 9: "1w (half token, sample)/block, 5 blocks/SM"}


def build():
    lib, log = standalone.build("qk_head_layouts")
    p = ctypes.c_void_p
    lib.qk_head_launch.argtypes = [ctypes.c_int, p, p, p, p, p, p, p, p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_float, p]
    return lib, log


def library_op():
    """The built ltx_kernels (build/<variant>/), or None."""
    try:
        return load_kernel()
    except Exception as e:  # the experiment stands without it
        print("library op not loaded:", e, flush=True)
        return None


def main():
    lib, ptxas_log = build()
    lk = library_op()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    ceiling = copy_tbps()
    print(f"copy {ceiling:.2f} TB/s", flush=True)
    bf16, hd = torch.bfloat16, 128
    results = []
    for batch, seq, heads in [(2, 2688, 32), (1, 4608, 24)]:
        angle = torch.rand(seq, hd, device="cuda") * 6.3
        cos, sin = angle.cos().contiguous(), angle.sin().contiguous()
        wq = (torch.rand(hd, device="cuda") + 0.5).to(bf16)
        wk = (torch.rand(hd, device="cuda") + 0.5).to(bf16)

        def eager(q, k):  # diffusers RMSNorm (eps 1e-6) per head, Flux's interleaved rope, on [B, S, H, D]
            def one(x, w):
                h = (x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(bf16) * w
                re, im = h.reshape(*h.shape[:-1], -1, 2).unbind(-1)
                rot = torch.stack([-im, re], dim=-1).flatten(3)
                return (h.float() * cos[:, None] + rot.float() * sin[:, None]).to(bf16)
            return one(q, wq), one(k, wk)

        def ours(v):
            def fn(q, k):
                qo, ko = torch.empty_like(q), torch.empty_like(k)
                rc = lib.qk_head_launch(v, q.data_ptr(), k.data_ptr(), qo.data_ptr(), ko.data_ptr(), wq.data_ptr(),
                                        wk.data_ptr(), cos.data_ptr(), sin.data_ptr(), batch, seq, heads * hd // 8,
                                        1e-6, torch.cuda.current_stream().cuda_stream)
                assert rc == 0, (v, rc)
                return qo, ko
            return fn

        impls = {"torch copy (q.clone, k.clone)": lambda q, k: (q.clone(), k.clone())}
        if lk is not None:
            impls["library qk_rmsnorm_rope"] = lambda q, k: lk.qk_rmsnorm_rope(q, k, wq, wk, cos, sin, 1e-6,
                                                                              rounding="diffusers")
        for v, name in LAYOUTS.items():
            if v == 4 and batch != 2:
                continue
            impls[name] = ours(2 * v)
            impls[name + " [copy]"] = ours(2 * v + 1)
        shape = (batch, seq, heads, hd)
        nbytes = 4 * 2 * batch * seq * heads * hd + 2 * 4 * seq * hd
        make = lambda i: (torch.randn(shape, device="cuda").to(bf16), torch.randn(shape, device="cuda").to(bf16))
        q0, k0 = make(0)
        ref = eager(q0, k0)
        for rnd in range(2):
            for impl, fn in impls.items():
                out = fn(q0, k0)
                want = (q0, k0) if "copy" in impl else ref
                exact = all(bool(torch.equal(o, r)) for o, r in zip(out, want))
                us = rotating_graph_us(fn, make, nbytes)
                frac = nbytes / us / 1e6 / ceiling
                print(f"{str(list(shape)):18s} {impl:50s} {us:8.2f} us {100 * frac:6.1f}%  bitwise={exact}", flush=True)
                results.append(dict(shape=list(shape), impl=impl, round=rnd, us=us, frac=frac, bitwise=exact))
    standalone.save("qk_head_layouts", ceiling, results, ptxas_log, 6000)


if __name__ == "__main__":
    main()
