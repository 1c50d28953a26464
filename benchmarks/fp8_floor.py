"""FP8 floor (issue 37): bf16 F.linear against float8_e4m3 rowwise torch._scaled_mm (with and without
fast accumulation) at LTX-Video 2B's and Wan 1.3B's linear shapes (M = tokens x batch 2), what a
separate per-token activation quantisation pass costs (eager and torch.compile'd), each GEMM's
relative L2 against float64; and whether torchao's float8 dynamic-activation / float8-weight rowwise
config runs on this torch (inference: no grad). With --attention, 8-bit attention instead (item 5):
bf16 SDPA on cuDNN and flash against SageAttention (INT8 q/k, package index: sageattention) and
cuDNN's FP8 SDPA (package index: nvidia-cudnn-frontend; e4m3 q/k/v with per-tensor scales, softmax
probabilities in e4m3; e4m3 output, which Hopper requires, at v's scale: the integration's
``fp8_attention``) at LTX-Video's and Wan's self-attention shapes, each output's relative L2 to
float32 SDPA; for cuDNN FP8 also with the per-tensor quantisation of q/k/v timed in.
Times: triton do_bench medians, L2 flushed.

    python3 -m benchmarks.fp8_floor [--attention] [--commit SHA] [--out DIR]
"""
import argparse
import functools
import traceback

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from ltx_dev.bench.harness import environment, write_json
from pathlib import Path

dev = "cuda"
E4M3 = torch.float8_e4m3fn
FMAX = torch.finfo(E4M3).max
SHAPES = {"ltx qkv/o": (5376, 2048, 2048), "ltx ff up": (5376, 2048, 8192), "ltx ff down": (5376, 8192, 2048),
          "wan qkv/o": (65520, 1536, 1536), "wan ff up": (65520, 1536, 8960), "wan ff down": (65520, 8960, 1536)}


def quant_rows(t):
    amax = t.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    scale = amax / FMAX
    return (t.float() / scale).clamp(-FMAX, FMAX).to(E4M3), scale


def rel(a, b):
    return float((a.double() - b).norm() / b.norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commit", default=None, metavar="SHA", help="the commit to record (default: git's HEAD)")
    ap.add_argument("--out", type=Path, default=None, help="directory for the JSON (default benchmarks/results)")
    ap.add_argument("--attention", action="store_true", help="measure 8-bit attention instead of the GEMMs")
    args = ap.parse_args()
    if args.attention:
        attention(args)
        return
    out = {"env": environment(args.commit), "rows": [],
           "timing": "triton do_bench median (ms), L2 flushed; quant_bytes: bf16 rows read, e4m3 rows and float32 "
                     "scales written"}
    for name, (M, K, N) in SHAPES.items():
        torch._dynamo.reset()  # a static compile per shape: no dynamic-shape kernel
        quant_c = torch.compile(quant_rows, dynamic=False)
        g = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(M, K, device=dev, generator=g).bfloat16()
        w = (torch.randn(N, K, device=dev, generator=g) / K ** 0.5).bfloat16()
        xq, xs = quant_rows(x)
        wq, ws = quant_rows(w)
        flops = 2 * M * K * N
        t_bf16 = do_bench(lambda: F.linear(x, w), warmup=25, rep=100)
        mm = lambda fast: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(), out_dtype=torch.bfloat16,
                                           use_fast_accum=fast)
        t_fp8 = do_bench(lambda: mm(False), warmup=25, rep=100)
        t_fp8f = do_bench(lambda: mm(True), warmup=25, rep=100)
        quant_c(x)
        t_q = do_bench(lambda: quant_rows(x), warmup=10, rep=50)
        t_qc = do_bench(lambda: quant_c(x), warmup=10, rep=50)
        ref = x.double() @ w.double().t()
        row = {"shape": name, "M": M, "K": K, "N": N, "bf16_ms": t_bf16, "fp8_ms": t_fp8, "fp8_fast_ms": t_fp8f,
               "quant_eager_ms": t_q, "quant_compiled_ms": t_qc, "bf16_tflops": flops / t_bf16 / 1e9,
               "fp8_tflops": flops / t_fp8 / 1e9, "fp8_fast_tflops": flops / t_fp8f / 1e9,
               "err_bf16": rel(F.linear(x, w), ref), "err_fp8": rel(mm(False), ref),
               "err_fp8_fast": rel(mm(True), ref), "quant_bytes": M * K * 3 + M * 4}
        out["rows"].append(row)
        print(f"{name:12s} bf16 {t_bf16 * 1e3:8.1f} us | fp8 {t_fp8 * 1e3:8.1f} fast {t_fp8f * 1e3:8.1f} | "
              f"quant eager {t_q * 1e3:7.1f} compiled {t_qc * 1e3:7.1f} us | err bf16 {row['err_bf16']:.2e} "
              f"fp8 {row['err_fp8']:.2e}", flush=True)
        del x, w, xq, wq, ref
        torch.cuda.empty_cache()

    # torchao's float8 dynamic activation / weight rowwise on a linear, under compile
    try:
        import torchao
        from torchao.quantization import quantize_, Float8DynamicActivationFloat8WeightConfig, PerRow
        out["torchao"] = {"version": torchao.__version__}
        M, K, N = SHAPES["ltx ff up"]
        lin = torch.nn.Linear(K, N, bias=True, device=dev, dtype=torch.bfloat16).requires_grad_(False)
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        with torch.no_grad():
            ref = lin(x)
            t_ref = do_bench(lambda: lin(x), warmup=25, rep=100)
            quantize_(lin, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()))
            f = torch.compile(lin)
            y = f(x)
            out["torchao"].update(ok=True, shape=[M, K, N], bf16_linear_ms=t_ref,
                                  ms=do_bench(lambda: f(x), warmup=25, rep=100), rel_to_bf16=rel(y, ref.double()))
        print("torchao", out["torchao"], flush=True)
    except Exception as e:  # noqa: BLE001
        out["torchao"] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}
        traceback.print_exc()
        print("torchao failed", out["torchao"], flush=True)
    print("wrote", write_json("fp8_floor", out, args.out))


ATTENTION_SHAPES = {"ltx self-attention": (2, 32, 2688, 64), "wan self-attention": (2, 12, 32760, 128)}


def attention(args) -> None:
    """bf16 SDPA (cuDNN, flash) against SageAttention's INT8-QK kernel and cuDNN's FP8 SDPA, [B, H, S, D]
    q/k/v."""
    from torch.nn.attention import SDPBackend

    out = {"env": environment(args.commit), "rows": [], "timing": "triton do_bench median (ms), L2 flushed",
           "reference": "F.scaled_dot_product_attention in float32 (memory-efficient backend)"}
    try:
        from sageattention import sageattn
        import sageattention
        out["sageattention"] = getattr(sageattention, "__version__", "installed")
    except Exception as e:  # noqa: BLE001 - not installed: say so
        sageattn, out["sageattention"] = None, f"{type(e).__name__}: {e}"
    for name, (B, H, S, D) in ATTENTION_SHAPES.items():
        g = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(B, H, S, D, device=dev, generator=g).bfloat16() for _ in range(3))
        ref = sdpa_reference(q, k, v)
        impls, refs = {}, {}
        for label, backend in (("bf16 cuDNN", SDPBackend.CUDNN_ATTENTION), ("bf16 flash", SDPBackend.FLASH_ATTENTION)):
            impls[label] = functools.partial(sdpa_on, backend, q, k, v)
        if sageattn is not None:
            impls["sageattn (int8 qk)"] = lambda: sageattn(q, k, v, tensor_layout="HND", is_causal=False)
        why = cudnn_fp8_unavailable()
        if why:
            out["rows"].append({"shape": name, "bhsd": [B, H, S, D], "impl": "cuDNN fp8", "error": why})
        else:
            import cudnn

            out["cudnn_frontend"] = f"{cudnn.__version__} (cuDNN {cudnn.backend_version()})"
            qkv8 = quantized(q, k, v)
            impls["cuDNN fp8 (per-tensor e4m3)"] = functools.partial(cudnn_fp8, *qkv8)
            impls["cuDNN fp8 + quantising q/k/v"] = lambda: cudnn_fp8(*quantized(q, k, v))
            for sharp in (2, 4):  # a peakier softmax than randn's: logits of std 2 and 4
                qs = q * sharp
                refs[f"bf16 cuDNN, q x{sharp}"] = refs[f"cuDNN fp8, q x{sharp}"] = sdpa_reference(qs, k, v)
                impls[f"bf16 cuDNN, q x{sharp}"] = functools.partial(sdpa_on, SDPBackend.CUDNN_ATTENTION, qs, k, v)
                impls[f"cuDNN fp8, q x{sharp}"] = functools.partial(cudnn_fp8, *quantized(qs, k, v))
        flops = 4 * B * H * S * S * D
        for label, fn in impls.items():
            try:
                y = fn()
                if isinstance(y, tuple):  # cuDNN FP8's e4m3 [B, S, H, D] and its descale
                    y = (y[0].float() * y[1]).transpose(1, 2)
                ms = do_bench(fn, warmup=10, rep=50)
                row = {"shape": name, "bhsd": [B, H, S, D], "impl": label, "ms": ms, "tflops": flops / ms / 1e9,
                       "rel_l2_to_fp32": rel(y, refs.get(label, ref))}
            except Exception as e:  # noqa: BLE001 - a backend refusing the shape: report it
                row = {"shape": name, "bhsd": [B, H, S, D], "impl": label,
                       "error": f"{type(e).__name__}: {str(e)[:200]}"}
            out["rows"].append(row)
            print(row, flush=True)
        del q, k, v, ref, refs, impls
        torch.cuda.empty_cache()
    print("wrote", write_json("fp8_attention", out, args.out))


def sdpa_on(backend, q, k, v):
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v)


def sdpa_reference(q, k, v):
    from torch.nn.attention import SDPBackend

    return sdpa_on(SDPBackend.EFFICIENT_ATTENTION, q.float(), k.float(), v.float()).double()


def quantized(q, k, v):
    """[B, H, S, D] q/k/v as the integration's FP8 attention takes them: [B, S, H, D] (here transposed
    views) in e4m3, each with its descale."""
    from ltx_kernels_diffusers.fp8_attention import quantize_per_tensor

    return [x for t in (q, k, v) for x in quantize_per_tensor(t.transpose(1, 2))]


def cudnn_fp8(q8, dq, k8, dk, v8, dv):
    """The integration's cuDNN FP8 SDPA (``optimize(..., fp8_attention=True)``): its e4m3 output
    [B, S, H, D] and that output's descale."""
    from ltx_kernels_diffusers.fp8_attention import fp8_sdpa

    return fp8_sdpa(q8, k8, v8, dq, dk, dv), dv


def cudnn_fp8_unavailable() -> str:
    try:
        from ltx_kernels_diffusers.fp8_attention import unavailable
    except ImportError as e:
        return f"the diffusers integration is not importable ({e})"
    return unavailable()


if __name__ == "__main__":
    main()
