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

    python3 benchmarks/generate_video.py                          # stock eager + optimised eager
    python3 benchmarks/generate_video.py --compile                # stock eager + optimised compiled
    python3 benchmarks/generate_video.py --no-optimized-kernels --compile
    python3 benchmarks/generate_video.py --all --num-frames 49    # the four configurations (README chart)

For every configuration it prints ms per step, it/s and the speedup against
stock eager (always measured in the same run), the relative difference of the
final latents from stock eager, and one step profiled with torch.profiler: GPU
time in GEMMs, in attention, and in everything else; GEMMs + attention is the
floor no elementwise work can remove. Writes
benchmarks/results/generate_video-<device>.json and docs/generate_video-<device>.png
(both to --out DIR when given); ``--chart-from JSON`` redraws the PNG and prints
the README block from a result file, without a GPU (and ``readme_block`` is what
benchmarks/render.py can call for the README).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, environment, load_kernel, write_json  # noqa: E402

sys.path.insert(0, str(ROOT))  # ltx_kernels_diffusers

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
    ap.add_argument("--out", type=Path, default=None, help="directory for the JSON and the PNG")
    ap.add_argument("--chart-from", type=Path, default=None, metavar="JSON",
                    help="only draw the PNG and print the README block of a result file (no GPU needed)")
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


# --- reporting ------------------------------------------------------------------------------------------

def table(rows: list) -> str:
    lines = ["| configuration | ms/step | it/s | speedup vs stock eager | GEMM + attention floor (ms) | "
             "other GPU time (ms) | rel. diff of latents vs stock |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r.get("profile")
        floor = f"{p['floor_ms']:.1f}" if p else "–"
        other = f"{p['other_ms']:.1f}" if p else "–"
        lines.append(f"| {r['config']} | {r['ms_per_step']:.1f} | {r['it_per_s']:.2f} | {r['speedup']:.2f}x | "
                     f"{floor} | {other} | {r['rel_l2_vs_stock']:.1e} |")
    return "\n".join(lines)


def readme_block(data: dict) -> str:
    """The README section for one result file: what was run, the table, the chart
    (for benchmarks/render.py's ``<!-- generate_video-<device>-results:begin -->`` block)."""
    env, shape, options = data["env"], data["shape"], data["options"]
    latent = "x".join(str(n) for n in shape["latent"])
    header = (f"{env['device']}, torch {env['torch']}, commit `{env['commit'][:7]}`, {env['date'][:10]}; "
              f"LTX-Video transformer, {shape['weights']}, bf16; {shape['num_frames']} frames at "
              f"{shape['width']}x{shape['height']} (latent {latent}, seq {shape['seq']}), transformer batch "
              f"{shape['transformer_batch']} (classifier-free guidance), {shape['text_tokens']} text tokens; "
              f"{options['steps']} timed steps after {options['warmup_iterations']} warm-up steps; optimize_ltx "
              f"{options['kernel_mode']} mode, GELU epilogue {'on' if options['gelu_epilogue'] else 'off'}; "
              f"torch.compile fullgraph, {options['compile_scope']} scope. Floor = GPU time in GEMMs + attention "
              "in one profiled step.")
    return f"{header}\n\n{table(data['rows'])}\n\n![end-to-end](docs/{chart_path(data, None).name})"


def chart(payload: dict, path: Path) -> None:
    """ms/step per configuration, split by the profiled step's GPU time into
    GEMM, attention and other kernels; the rest of the step is host time and
    gaps (GPU idle)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, env, shape, options = payload["rows"], payload["env"], payload["shape"], payload["options"]
    title = (f"LTX-Video transformer ({shape['weights']}), bf16, {env['device']}\n"
             f"{shape['num_frames']} frames at {shape['width']}x{shape['height']} (seq {shape['seq']}, batch "
             f"{shape['transformer_batch']}); optimize_ltx {options['kernel_mode']} mode; "
             f"{options['compile_scope']} compiled\n"
             f"torch {env['torch']}, commit {env['commit'][:7]}; bars split by one profiled step")

    fig, ax = plt.subplots(figsize=(9, 0.8 * len(rows) + 2.2))
    labels = [r["config"] for r in rows][::-1]
    y = list(range(len(rows)))
    left = [0.0] * len(rows)
    parts = [("gemm_ms", "GEMM", "#4c72b0"), ("attention_ms", "attention", "#55a868"),
             ("other_ms", "elementwise & other kernels", "#dd8452")]
    profiled = all("profile" in r for r in rows)
    # kernel time as measured; scaled down only if it exceeds the step (timing noise)
    scale = [min(1.0, r["ms_per_step"] / max(r["profile"]["kernels_ms"], 1e-9)) if profiled else 0.0
             for r in rows][::-1]
    for key, label, color in parts if profiled else []:
        widths = [r["profile"][key] * f for r, f in zip(rows[::-1], scale)]
        ax.barh(y, widths, left=left, color=color, label=label)
        left = [a + b for a, b in zip(left, widths)]
    rest = [r["ms_per_step"] for r in rows][::-1]
    ax.barh(y, [max(t - l, 0.0) for t, l in zip(rest, left)], left=left, color="#c8c8c8",
            label="host / idle" if profiled else "ms per step")
    for yi, r in zip(y, rows[::-1]):
        ax.text(r["ms_per_step"], yi, f"  {r['ms_per_step']:.0f} ms ({r['speedup']:.2f}x)", va="center")
    ax.set_yticks(y, labels)
    ax.set_xlabel("ms per denoising step (lower is better)")
    ax.set_xlim(0, max(rest) * 1.35)
    ax.set_title(title, fontsize=9, loc="left")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=4, fontsize=8, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    args = parse_args()
    if args.chart_from is not None:
        payload = json.loads(args.chart_from.read_text())
        print(readme_block(payload))
        chart(payload, chart_path(payload, args.out))
        print(f"wrote {chart_path(payload, args.out)}")
        return
    if not torch.cuda.is_available():
        sys.exit("generate_video.py needs a CUDA GPU")
    configs = configurations(args)
    kernel = load_kernel() if any(c.kernels for c in configs) else None
    env = environment()
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
    print("\n" + readme_block(payload) + "\n")
    print(f"wrote {path}")
    draw(payload, args.out, path)


def chart_path(payload: dict, out_dir) -> Path:
    """docs/generate_video-<device>.png (named like the JSON), or in ``out_dir``."""
    device = payload["env"]["device"].replace("NVIDIA ", "").replace(" ", "-")
    return (out_dir or ROOT / "docs") / f"generate_video-{device}.png"


def draw(payload: dict, out_dir, json_path: Path) -> None:
    png = chart_path(payload, out_dir)
    try:
        chart(payload, png)
    except ImportError:
        print(f"matplotlib is not installed: no chart. Draw it later with\n"
              f"  python3 benchmarks/generate_video.py --chart-from {json_path}")
        return
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
