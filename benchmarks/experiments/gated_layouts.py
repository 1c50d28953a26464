"""Experiment (issue 4): thread layouts of the exact bf16 GEGLU/SwiGLU kernel, as standalone
kernels (gated_layouts.cu, built here with nvcc and called through ctypes) against eager and
torch.compile in one process, two rounds. It picked the layout of kernel_src/activation.cu's gated
kernel (one word of each half per thread, 128-thread blocks over (row chunk, row)); results in
benchmarks/results/experiments/activation-gated-layouts-*.

    python3 benchmarks/experiments/gated_layouts.py     (GPU machine; JSON to $OUT or /tmp)
"""
import ctypes, os, subprocess, sys, json
from pathlib import Path
import torch
import torch.nn.functional as F
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import rotating_graph_us, copy_tbps

here = Path(__file__).resolve().parent
so = Path("/tmp/gated_layouts.so")
subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", "-O3", "-std=c++17", "-arch=sm_90", "-Xptxas", "-v",
                str(here / "gated_layouts.cu"), "-o", str(so)], check=True, stderr=open("/tmp/gated_layouts_ptxas.log", "w"))
lib = ctypes.CDLL(str(so))
lib.glu_launch.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_int, ctypes.c_void_p]
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
ceiling = copy_tbps()
print(f"copy {ceiling:.2f} TB/s", flush=True)
geglu = lambda x: (lambda a, b: F.gelu(a, approximate="tanh") * b)(*x.chunk(2, dim=-1))
swiglu = lambda x: (lambda a, b: F.silu(a) * b)(*x.chunk(2, dim=-1))
VARIANTS = {0: "rowloop256", 1: "rowloop256 asm", 2: "rowloop128", 3: "flat128", 4: "flat128 asm", 5: "flat256",
            6: "flat128x2 asm", 7: "flat1024", 8: "flat512 asm"}
results = []
for name, eager, kind, shape in [("geglu", geglu, 0, (2, 2688, 16384)), ("swiglu", swiglu, 1, (2, 2048, 16384)),
                                 ("geglu", geglu, 0, (2, 8160, 16384))]:
    H = shape[-1] // 2
    rows = shape[0] * shape[1]
    nbytes = 3 * rows * H * 2
    x0 = torch.randn(shape, device="cuda").bfloat16()
    ref = eager(x0)
    def ours(v):
        def fn(x):
            out = torch.empty(x.shape[:-1] + (H,), dtype=x.dtype, device=x.device)
            rc = lib.glu_launch(v, kind, x.data_ptr(), out.data_ptr(), rows, H // 8, 1, torch.cuda.current_stream().cuda_stream)
            assert rc == 0, rc
            return out
        return fn
    impls = {"eager": eager, "torch.compile": torch.compile(eager)}
    impls.update({VARIANTS[v]: ours(v) for v in VARIANTS})
    make = lambda i: (torch.randn(shape, device="cuda").bfloat16(),)
    for rnd in range(2):
        for impl, fn in impls.items():
            out = fn(x0)
            exact = bool(torch.equal(out, ref))
            us = rotating_graph_us(fn, make, nbytes)
            frac = nbytes / us / 1e6 / ceiling
            print(f"{name:7s} {str(list(shape)):18s} {impl:16s} {us:8.2f} us {100*frac:6.1f}%  bitwise={exact}", flush=True)
            results.append(dict(op=name, shape=list(shape), impl=impl, round=rnd, us=us, frac=frac, bitwise=exact))
out = Path(os.environ.get("OUT", "/tmp")) / f"gated_layouts-{torch.cuda.get_device_name().replace(' ', '-')}.json"
out.write_text(json.dumps(dict(device=torch.cuda.get_device_name(), copy_tbps=ceiling, rows=results), indent=1))
print(open("/tmp/gated_layouts_ptxas.log").read()[-3000:])
