"""End-to-end LTX-Video benchmark (issue 5): LTXPipeline's denoising loop
(classifier-free guidance over a doubled batch, FlowMatch Euler steps with
LTX-Video's shifted sigmas) on the LTX-Video transformer, stock against
optimize_ltx, eager against torch.compile.

Random weights by default (``LTXVideoTransformer3DModel()``, the 2B config;
nothing is downloaded); ``--model PATH`` loads the transformer of a local
diffusers checkout (``PATH/transformer`` or PATH itself). Prompt embeddings are
random T5-XXL-sized states (128 tokens, 40 of them valid): a step's time does
not depend on their values. Only the denoising loop runs (no text encoder, no
VAE decode): it is what ms/step measures.

    python3 -m benchmarks.generate_video                          # stock eager + optimised eager
    python3 -m benchmarks.generate_video --compile                # stock eager + optimised compiled
    python3 -m benchmarks.generate_video --no-optimized-kernels --compile
    python3 -m benchmarks.generate_video --all --num-frames 49    # the four configurations (README table)

For every configuration it prints ms per step, it/s and the speedup against
stock eager (always measured in the same run), the relative difference of the
final latents from stock eager, and one step profiled with torch.profiler: GPU
time in GEMMs, in attention, and in everything else; GEMMs + attention is the
floor no elementwise work can remove. Writes
benchmarks/results/generate_video-<device>.json (to --out DIR when given), which
`ltx-dev render` puts into README.md and docs/performance.md.
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ltx_dev import kernel as kernel_loading
from ltx_dev.bench.harness import environment, write_json
from ltx_dev.bench.render import end_to_end_block

VAE_TEMPORAL, VAE_SPATIAL = 8, 32  # LTX-Video VAE compression ratios
TEXT_TOKENS, TEXT_VALID, TEXT_WIDTH = 128, 40, 4096
ATTENTION_KERNELS = ("flash", "fmha", "attention", "attn", "sdpa", "mha")
GEMM_KERNELS = ("gemm", "nvjet", "xmma", "cutlass", "cublas", "matmul", "splitk", "triton_tem")
DEVICE = "cuda"  # a module constant, so the script can be tried on the CPU with a tiny model


@dataclass(frozen=True)
class Config:
    kernels: bool
    compile: bool

    @property
    def name(self) -> str:
        return {(False, False): "stock eager", (True, False): "ltx_kernels eager",
                (False, True): "stock + torch.compile", (True, True): "ltx_kernels + torch.compile"}[
            (self.kernels, self.compile)]


STOCK = Config(kernels=False, compile=False)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--use-optimized-kernels", dest="kernels", action="store_true", default=True,
                    help="run the transformer through optimize_ltx (default)")
    ap.add_argument("--no-optimized-kernels", dest="kernels", action="store_false",
                    help="run the stock transformer")
    ap.add_argument("--compile", action="store_true", help="torch.compile the transformer (fullgraph)")
    ap.add_argument("--all", action="store_true", help="measure all four configurations")
    ap.add_argument("--batch-size", type=int, default=1, help="videos per prompt (the transformer sees twice "
                                                              "as many: classifier-free guidance)")
    ap.add_argument("--num-frames", type=int, default=161)
    ap.add_argument("--height", type=int, default=512)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--steps", type=int, default=50, help="timed denoising steps per configuration")
    ap.add_argument("--warmup-iterations", type=int, default=2,
                    help="untimed denoising steps first (compilation happens here)")
    ap.add_argument("--guidance-scale", type=float, default=3.0)
    ap.add_argument("--model", type=Path, default=None,
                    help="local diffusers LTX-Video checkout (default: random weights, 2B config)")
    ap.add_argument("--kernel-mode", choices=("exact", "fast"), default="exact",
                    help="optimize_ltx(exact_mode=...): eager roundings (default) or one rounding per fused op")
    ap.add_argument("--no-gelu-epilogue", dest="gelu_epilogue", action="store_false",
                    help="projection, then the GELU-tanh kernel, instead of one GEMM with the GELU epilogue")
    ap.add_argument("--compile-scope", choices=("blocks", "model"), default="blocks",
                    help="compile the repeated transformer blocks (regional, fast to compile; default) or the "
                         "whole model")
    ap.add_argument("--no-profile", dest="profile", action="store_false", help="skip the profiled step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="directory for the JSON (default benchmarks/results)")
    ap.add_argument("--commit", default=None, metavar="SHA",
                    help="the commit to record (default: git's HEAD; give it where the tree is no git checkout)")
    ap.add_argument("--dev-build", action="store_true",
                    help="optimise with the development build (_build/dev) instead of the release build")
    args = ap.parse_args()
    if (args.num_frames - 1) % VAE_TEMPORAL or args.height % VAE_SPATIAL or args.width % VAE_SPATIAL:
        ap.error(f"--num-frames must be 8k+1 and --height/--width multiples of {VAE_SPATIAL} "
                 "(LTX-Video's VAE compression)")
    if args.steps < 1 or args.batch_size < 1 or args.warmup_iterations < 0:
        ap.error("--steps and --batch-size must be >= 1, --warmup-iterations >= 0")
    return args


def configurations(args) -> list:
    if args.all:
        return [Config(k, c) for c in (False, True) for k in (False, True)]
    wanted = Config(args.kernels, args.compile)
    return [STOCK] if wanted == STOCK else [STOCK, wanted]


# --- the model and the work ---------------------------------------------------------------------------

def base_model(args):
    """The transformer every configuration copies: random (seeded) on the GPU,
    or --model's weights (local files only)."""
    from diffusers import LTXVideoTransformer3DModel

    if args.model is None:
        torch.manual_seed(args.seed)
        with torch.device(DEVICE):
            model = LTXVideoTransformer3DModel()
        return model.to(torch.bfloat16).eval()
    subfolder = "transformer" if (args.model / "transformer" / "config.json").is_file() else None
    model = LTXVideoTransformer3DModel.from_pretrained(args.model, subfolder=subfolder, torch_dtype=torch.bfloat16,
                                                       local_files_only=True)
    return model.to(DEVICE).eval()


def scheduler_for(args):
    """FlowMatchEulerDiscreteScheduler as LTX-Video configures it (or --model's)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    if args.model is not None and (args.model / "scheduler").is_dir():
        return FlowMatchEulerDiscreteScheduler.from_pretrained(args.model, subfolder="scheduler",
                                                               local_files_only=True)
    return FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
                                           base_image_seq_len=1024, max_image_seq_len=4096, shift_terminal=0.1)


@dataclass
class Video:
    """The latent grid and the fixed inputs of one generation."""

    frames: int
    height: int
    width: int
    latents: torch.Tensor          # [videos, seq, 128] float32, packed
    prompt_embeds: torch.Tensor    # [2 * videos, 128, 4096] (negative, then positive)
    prompt_mask: torch.Tensor      # [2 * videos, 128]

    @property
    def seq(self) -> int:
        return self.frames * self.height * self.width


def video_inputs(args, in_channels: int) -> Video:
    frames = (args.num_frames - 1) // VAE_TEMPORAL + 1
    height, width = args.height // VAE_SPATIAL, args.width // VAE_SPATIAL
    g = torch.Generator().manual_seed(args.seed + 1)
    latents = torch.randn(args.batch_size, frames * height * width, in_channels, generator=g)
    embeds = torch.randn(2 * args.batch_size, TEXT_TOKENS, TEXT_WIDTH, generator=g)
    mask = torch.zeros(2 * args.batch_size, TEXT_TOKENS)
    mask[:, :TEXT_VALID] = 1
    return Video(frames, height, width, latents.to(DEVICE), embeds.to(DEVICE, torch.bfloat16), mask.to(DEVICE))


class Denoising:
    """LTXPipeline's loop, one step at a time."""

    def __init__(self, model, video: Video, scheduler, steps: int, guidance_scale: float):
        self.model, self.video, self.guidance_scale = model, video, guidance_scale
        self.scheduler = copy.deepcopy(scheduler)
        cfg = self.scheduler.config
        slope = (cfg.get("max_shift", 1.15) - cfg.get("base_shift", 0.5)) / (
            cfg.get("max_image_seq_len", 4096) - cfg.get("base_image_seq_len", 256))
        mu = cfg.get("base_shift", 0.5) + slope * (video.seq - cfg.get("base_image_seq_len", 256))
        self.scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu, device=DEVICE)
        self.timesteps = self.scheduler.timesteps
        self.latents = video.latents.clone()

    @torch.no_grad()
    def step(self, index: int) -> None:
        t, v = self.timesteps[index], self.video
        x = torch.cat([self.latents] * 2).to(torch.bfloat16)
        noise = self.model(hidden_states=x, encoder_hidden_states=v.prompt_embeds, timestep=t.expand(x.shape[0]),
                           encoder_attention_mask=v.prompt_mask, num_frames=v.frames, height=v.height,
                           width=v.width, rope_interpolation_scale=(VAE_TEMPORAL / 25, VAE_SPATIAL, VAE_SPATIAL),
                           return_dict=False)[0].float()
        uncond, text = noise.chunk(2)
        noise = uncond + self.guidance_scale * (text - uncond)
        self.latents = self.scheduler.step(noise, t, self.latents, return_dict=False)[0]


def prepare(config: Config, base, kernel, args):
    """A fresh copy of the transformer, optimised and/or compiled for ``config``."""
    from ltx_kernels_diffusers import optimize_ltx

    model = copy.deepcopy(base)
    if config.kernels:
        optimize_ltx(model, kernel=kernel, exact_mode=args.kernel_mode == "exact", gelu_epilogue=args.gelu_epilogue)
    if config.compile:
        torch._dynamo.reset()
        if args.compile_scope == "blocks":
            model.compile_repeated_blocks(fullgraph=True)
        else:
            model = torch.compile(model, fullgraph=True)
    return model


# --- measuring --------------------------------------------------------------------------------------------

def kernel_category(name: str) -> str:
    lowered = name.lower()
    if any(k in lowered for k in ATTENTION_KERNELS):
        return "attention"
    if any(k in lowered for k in GEMM_KERNELS):
        return "gemm"
    return "other"


def profile_step(run: Denoising, index: int, device_type=torch.autograd.DeviceType.CUDA) -> dict:
    """GPU time of one step by kernel category (ms), and the step's wall time
    (``device_type=CPU`` profiles CPU ops instead, to try the script without a GPU)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device_type == torch.autograd.DeviceType.CUDA
    torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        run.step(index)
        torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - start) * 1e3
    totals = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    top: dict = {}
    for event in prof.events():
        if event.device_type != device_type:
            continue
        us = event.time_range.elapsed_us()
        totals[kernel_category(event.name)] += us
        top[event.name] = top.get(event.name, 0.0) + us
    gpu = {k: round(v / 1e3, 3) for k, v in totals.items()}
    busiest = sorted(top.items(), key=lambda kv: -kv[1])[:8]
    return {"gemm_ms": gpu["gemm"], "attention_ms": gpu["attention"], "other_ms": gpu["other"],
            "kernels_ms": round(sum(totals.values()) / 1e3, 3), "floor_ms": round(gpu["gemm"] + gpu["attention"], 3),
            "profiled_wall_ms": round(wall_ms, 3),
            "top_kernels": [{"name": n[:120], "ms": round(us / 1e3, 3), "category": kernel_category(n)}
                            for n, us in busiest]}


def progress(total: int, desc: str):
    try:
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit="step", leave=False)
    except ImportError:
        return None


def measure(config: Config, base, kernel, video: Video, scheduler, args):
    """Warm up, time ``args.steps`` steps, profile one; returns (row, final latents)."""
    print(f"\n== {config.name}", flush=True)
    built = time.perf_counter()
    model = prepare(config, base, kernel, args)
    warm = Denoising(model, video, scheduler, max(args.steps, args.warmup_iterations), args.guidance_scale)
    if config.compile:
        print("   compiling (first warm-up step) ...", flush=True)
    for i in range(args.warmup_iterations):
        warm.step(i)
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - built

    run = Denoising(model, video, scheduler, args.steps, args.guidance_scale)
    bar = progress(args.steps, config.name)
    step_ms = []
    for i in range(args.steps):
        start = time.perf_counter()
        run.step(i)
        torch.cuda.synchronize()
        step_ms.append((time.perf_counter() - start) * 1e3)
        if bar is not None:
            bar.set_postfix(ms_per_step=f"{step_ms[-1]:.1f}")
            bar.update()
        elif (i + 1) % max(1, args.steps // 5) == 0:
            print(f"   step {i + 1}/{args.steps}: {step_ms[-1]:.1f} ms", flush=True)
    if bar is not None:
        bar.close()
    latents = run.latents.clone()
    row = {"config": config.name, "kernels": config.kernels, "compile": config.compile,
           "ms_per_step": round(sum(step_ms) / len(step_ms), 3),
           "ms_per_step_median": round(statistics.median(step_ms), 3),
           "it_per_s": round(1e3 * len(step_ms) / sum(step_ms), 3), "warmup_s": round(warmup_s, 1)}
    if args.profile:
        row["profile"] = profile_step(Denoising(model, video, scheduler, args.steps, args.guidance_scale), 0)
        p = row["profile"]
        print(f"   one step profiled: GEMM {p['gemm_ms']:.1f} ms, attention {p['attention_ms']:.1f} ms, other "
              f"{p['other_ms']:.1f} ms (kernels {p['kernels_ms']:.1f} ms, wall {p['profiled_wall_ms']:.1f} ms); "
              f"floor GEMM+attention {p['floor_ms']:.1f} ms", flush=True)
    del run, warm, model
    gc.collect()
    torch.cuda.empty_cache()
    return row, latents


def rel_l2(got: torch.Tensor, expected: torch.Tensor) -> float:
    got, expected = got.double(), expected.double()
    return ((got - expected).norm() / expected.norm()).item()


def main() -> None:
    args = parse_args()
    if not torch.cuda.is_available():
        sys.exit("generate_video.py needs a CUDA GPU")
    configs = configurations(args)
    kernel = kernel_loading.load(dev=args.dev_build) if any(c.kernels for c in configs) else None
    env = environment(args.commit, args.dev_build)
    print(f"{env['device']}  torch {env['torch']}  commit {env['commit'][:12]}", flush=True)
    base = base_model(args)
    video = video_inputs(args, base.config.in_channels)
    scheduler = scheduler_for(args)
    shape = {"num_frames": args.num_frames, "height": args.height, "width": args.width,
             "latent": [video.frames, video.height, video.width], "seq": video.seq,
             "transformer_batch": 2 * args.batch_size, "text_tokens": TEXT_TOKENS, "dtype": "bfloat16",
             "weights": str(args.model) if args.model else "random (LTXVideoTransformer3DModel(), 2B)"}
    print(f"{args.num_frames} frames at {args.height}x{args.width}: latent {video.frames}x{video.height}x"
          f"{video.width}, seq {video.seq}, transformer batch {2 * args.batch_size}, {args.steps} steps", flush=True)

    rows, stock_latents = [], None
    for config in configs:
        row, latents = measure(config, base, kernel, video, scheduler, args)
        if config == STOCK:
            stock_latents = latents
        row["rel_l2_vs_stock"] = rel_l2(latents, stock_latents)
        rows.append(row)
    stock_ms = rows[0]["ms_per_step"]
    for row in rows:
        row["speedup"] = round(stock_ms / row["ms_per_step"], 3)

    options = {"kernel_mode": args.kernel_mode, "gelu_epilogue": args.gelu_epilogue,
               "compile_scope": args.compile_scope, "steps": args.steps, "warmup_iterations": args.warmup_iterations,
               "guidance_scale": args.guidance_scale, "seed": args.seed}
    payload = {"env": env, "shape": shape, "options": options, "rows": rows,
               "timing": "wall time per denoising step (transformer on the CFG batch, guidance, scheduler step), "
                         "synchronised after each step; mean over the timed steps",
               "profile": "one extra step under torch.profiler; GPU kernel time by name: attention (flash/fmha/"
                          "sdpa...), GEMM (gemm/nvjet/xmma/cutlass...), other"}
    path = write_json("generate_video", payload, args.out)
    print("\n" + end_to_end_block(payload) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
