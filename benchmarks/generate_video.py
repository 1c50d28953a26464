"""End-to-end benchmark (issues 5 and 35): each model's own denoising loop, as its diffusers 0.42.1
pipeline runs it (scheduler, sigmas, classifier-free guidance), on the transformer alone: stock
against ours (``ltx_kernels_diffusers.optimize``), eager against torch.compile.

    python3 -m benchmarks.generate_video --model ltx                    # LTX-Video 0.9 2B, full depth
    python3 -m benchmarks.generate_video --model wan --layers 4 --steps 5
    python3 -m benchmarks.generate_video --model wan --config 14b-i2v --layers 4 --steps 5
    python3 -m benchmarks.generate_video --model mochi --device cpu --config tiny --configs stock-eager

Models (``--model``) and their configurations (``--config``), with where their numbers come from,
are the table in tools/ltx_dev/bench/end_to_end.py (MODELS): LTX-Video 0.9, LTX-2, Wan 2.1 (1.3B,
14B, text- and image-to-video), Mochi 1, Flux.1-dev, each at issue 35's step shape. Random weights
by default (seeded, nothing downloaded); ``--weights PATH`` loads the transformer of a local
diffusers checkout. Prompt embeddings are random tensors of the text encoder's shape (a step's
time does not depend on their values); no text encoder and no VAE run. ``--layers N`` builds N
layers (units) instead of L and scales every time to full depth from the N-layer and the 1-layer
model (end_to_end.DEPTH_METHOD); the output and the JSON say so.

Per configuration (stock eager, ours eager, stock compile, ours + compile; ``--configs``) it
prints ms per step and the speedup against stock eager (always measured), the relative L2 of the
final latents against stock eager, and one profiled step split into GEMM, attention and other GPU
time. First it measures the attention backends (diffusers' ``set_attention_backend``: native,
cuDNN, flash, memory-efficient) on the stock model (under ``--train`` on its LoRA step, whose
attention backward decides); ``--attention-backend auto`` runs the configurations with the fastest
whose first-step output (LoRA grads) is within ``--attention-tolerance`` (relative L2) of the
native backend's. A model ``optimize`` does not support yet is reported as
such and measured stock. Writes benchmarks/results/generate_video-<model>[-<config>]-<device>.json
(to ``--out DIR`` when given) and a chart beside it (PNG with matplotlib, else SVG);
``ltx-dev render`` puts the runs into README.md and docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime as _dt
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ltx_dev import kernel as kernel_loading
from ltx_dev.bench import end_to_end as e2e
from ltx_dev.bench import gpu_state
from ltx_dev.bench.harness import environment as gpu_environment
from ltx_dev.bench.harness import git_commit, write_json
from ltx_dev.bench.render import back_to_back, fp8_block, kernel_timeline, model_block, train_table

ATTENTION_KERNELS = ("flash", "fmha", "attention", "attn", "sdpa", "mha")
GEMM_KERNELS = ("gemm", "nvjet", "xmma", "cutlass", "cublas", "matmul", "splitk", "triton_tem")
INDUCTOR_ELEMENTWISE = ("triton_poi_", "triton_red_", "triton_per_")  # templates (triton_tem_) go by their names
PROFILE_NOTE = ("one extra step under torch.profiler (on a GPU, every configuration's in a process of its own "
                "after the timing: profile_pass); device time by kernel name: attention (flash/fmha/sdpa...), "
                "GEMM (gemm/nvjet/xmma/cutlass...), other (Inductor's pointwise and reduction kernels included, "
                "whatever ops their names list)")
DEVICE = "cuda"  # --device cpu sets it, to try the script without a GPU on a tiny model
PROBE_STEPS = 3  # timed steps per attention backend
# diffusers' attention backends (attention_dispatch.AttentionBackendName) and PyTorch's SDPA backend for
# the processors that call F.scaled_dot_product_attention themselves (stock Mochi).
DIFFUSERS_BACKENDS = {"native": "native", "cudnn": "_native_cudnn", "flash": "_native_flash",
                      "efficient": "_native_efficient"}
SDPA_BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}
# --train: peft LoRA adapters on the attention projections (issue 36), the base frozen
LORA_RANK = 64
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")
GELU_EPILOGUE_MODELS = ("ltx", "flux")  # the integrations whose Options have gelu_epilogue
TARGET_GRAD_AGREEMENT = 1.1  # ours' relative L2 of the LoRA grads to an fp32 stock step, at most 1.1x stock bf16's


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=list(e2e.MODELS), default="ltx")
    ap.add_argument("--config", default=None,
                    help="the model's configuration: " + "; ".join(
                        f"{k}: {', '.join(m.variants)} (default {m.default})" for k, m in e2e.MODELS.items()))
    ap.add_argument("--weights", type=Path, default=None,
                    help="local diffusers checkout (PATH/transformer or PATH itself; default: random weights)")
    ap.add_argument("--layers", type=int, default=None, metavar="N",
                    help="build N layers (Flux: N double + 2N single blocks) and scale to full depth")
    ap.add_argument("--configs", default=",".join(e2e.CONFIGS),
                    help=f"comma-separated, of {', '.join(e2e.CONFIGS)} (stock-eager always runs)")
    ap.add_argument("--attention-backend", choices=("auto", *e2e.ATTENTION_BACKENDS), default="auto",
                    help="auto: the fastest within --attention-tolerance of native")
    ap.add_argument("--attention-tolerance", type=float, default=e2e.ATTENTION_TOLERANCE,
                    help="relative L2 of the first step's output against the native backend's (default %(default)s)")
    ap.add_argument("--batch-size", type=int, default=None, help="videos per prompt (default 1)")
    ap.add_argument("--num-frames", type=int, default=None)
    ap.add_argument("--height", type=int, default=None)
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--steps", type=int, default=10, help="timed denoising steps per configuration (>= 2)")
    ap.add_argument("--warmup-iterations", type=int, default=2,
                    help="untimed denoising steps first (compilation happens here)")
    ap.add_argument("--guidance-scale", type=float, default=None, help="default: the pipeline's")
    ap.add_argument("--kernel-mode", choices=("exact", "fast"), default="exact",
                    help="optimize(exact_mode=...): eager roundings (default) or one rounding per fused op")
    ap.add_argument("--no-gelu-epilogue", dest="gelu_epilogue", action="store_false",
                    help="LTX-Video, Flux: projection, then the GELU-tanh kernel, instead of one GEMM with the epilogue")
    ap.add_argument("--compile-scope", choices=("blocks", "model"), default="blocks",
                    help="compile the repeated blocks one by one (regional; default) or the whole model")
    ap.add_argument("--compile-mode", choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs"),
                    default="default", help="torch.compile's mode for every compiled configuration; reduce-overhead "
                    "replays CUDA graphs (no launch cost on the host; use it with --compile-scope model)")
    ap.add_argument("--cpp-wrapper", action="store_true",
                    help="inductor's C++ wrapper (torch._inductor.config.cpp_wrapper): compiled graphs launch their "
                    "kernels and call our ops from C++ instead of Python, for less host time per block")
    ap.add_argument("--skip-guard-eval", action="store_true",
                    help="time the steps under torch.compiler.set_stance(skip_guard_eval_unsafe=True): after the "
                    "warm-up each compiled call runs only the guards that tell its graphs apart (host-bound steps: "
                    "a regionally compiled block's guards cost the host ~0.1-0.3 ms; unsafe where inputs change; "
                    "slower, not faster, on LTX-Video's FP8 step: docs/fp8.md)")
    ap.add_argument("--no-profile", dest="profile", action="store_false", help="skip the profiled step")
    ap.add_argument("--profile-into", type=Path, default=None, help=argparse.SUPPRESS)  # profile_pass's child
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: to try the script on a tiny model (--config tiny)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="directory for the JSON and chart (default "
                                                           "benchmarks/results)")
    ap.add_argument("--commit", default=None, metavar="SHA",
                    help="the commit to record (default: git's HEAD; give it where the tree is no git checkout)")
    ap.add_argument("--dev-build", action="store_true", help="optimise with the development build (_build/dev)")
    ap.add_argument("--train", action="store_true",
                    help="time one LoRA training step (forward + backward) per iteration instead of denoising")
    ap.add_argument("--grad-checkpointing", choices=("off", "on"), default="off",
                    help="--train: diffusers' enable_gradient_checkpointing (default off)")
    ap.add_argument("--lora-rank", type=int, default=LORA_RANK, help="--train: the adapters' rank (default 64)")
    ap.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                    help="--train: then stock compile and ours + compile side by side in one process, timed in "
                         "turns for ROUNDS rounds of --steps steps (the order swapped each round), so that the "
                         "host's drift falls on both alike (host-bound steps; both copies must fit the GPU)")
    ap.add_argument("--fp8", action="store_true",
                    help="also run the FP8 configurations (issue 37: ours fp8 eager and + compile, torchao fp8 + "
                         f"compile; --model {', '.join(FP8_MODELS)}) and measure each one's first-step error "
                         "against fp32")
    ap.add_argument("--no-fp8-fast-accum", dest="fp8_fast_accum", action="store_false",
                    help="--fp8: ours without cuBLASLt's fast accumulation (optimize's default has it)")
    ap.add_argument("--fp8-attention", action="store_true",
                    help="--fp8 (not --model ltx): ours fp8 with the long attentions on cuDNN's FP8 SDPA "
                         "(optimize's fp8_attention; needs nvidia-cudnn-frontend); its own result file")
    ap.add_argument("--no-fp8-fuse-qkv", dest="fp8_fuse_qkv", action="store_false",
                    help="--fp8 --model ltx: ours with three q/k/v GEMMs per self-attention instead of one "
                         "(optimize's fp8_fuse_qkv default); its own result file")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="ours (every configuration) with optimize's cuda_graph=True: each transformer call replays "
                         "one CUDA graph; its own result file")
    ap.add_argument("--parallel", choices=("ulysses", "ring"), default=None,
                    help="under torchrun (--nproc-per-node N): every configuration on one GPU (each rank on its "
                         "own) and then with diffusers' context parallelism of degree N (issue 38)")
    ap.add_argument("--chart-from", type=Path, default=None, metavar="JSON",
                    help="only redraw the chart of a result file (beside it, or in --out) and print its table")
    ap.add_argument("--resplit", type=Path, default=None, metavar="JSON",
                    help="only recompute an inference result's GEMM / attention / other split from its per-kernel "
                         "times with today's kernel names (then its depth scaling, targets and chart), in place")
    args = ap.parse_args(argv)

    spec = e2e.MODELS[args.model]
    if args.config is None:
        args.config = spec.default
    if args.config not in spec.variants:
        ap.error(f"--config for {args.model}: one of {', '.join(spec.variants)}")
    variant = spec.variant(args.config)
    base_step = variant.step or spec.step
    overrides = {"frames": args.num_frames, "height": args.height, "width": args.width, "videos": args.batch_size}
    args.step = dataclasses.replace(base_step, **{k: v for k, v in overrides.items() if v is not None})
    problems = e2e.shape_problems(spec, args.step)
    if problems:
        ap.error("; ".join(problems))
    full = args.full_layers = variant.units  # a --weights checkout may say otherwise (build)
    args.scale_requested = args.layers is not None
    if args.layers is None:
        args.layers = full
    if args.layers != full and not 2 <= args.layers < full:
        ap.error(f"--layers: 2..{full - 1} (scaled to {full}) or {full} (full depth)")
    if args.steps < 2 or args.step.videos < 1 or args.warmup_iterations < 0:
        ap.error("--steps >= 2, --batch-size >= 1, --warmup-iterations >= 0")
    if not args.train and (args.grad_checkpointing != "off" or args.lora_rank != LORA_RANK):
        ap.error("--grad-checkpointing and --lora-rank go with --train")
    if args.lora_rank < 1:
        ap.error("--lora-rank >= 1")
    if args.interleave and (not args.train or args.interleave < 2):
        ap.error("--interleave: with --train, ROUNDS >= 2")
    wanted = [c.strip() for c in args.configs.split(",") if c.strip()]
    if args.parallel and (args.train or args.fp8 or args.device != "cuda" or parallel_world() < 2):
        ap.error("--parallel: inference on GPUs, launched as `torchrun --nproc-per-node N -m benchmarks.generate_video"
                 " ... --parallel ulysses` with N >= 2 (not with --train or --fp8)")
    if args.parallel:
        uneven = parallel_uneven(spec, args.step, parallel_world())
        if uneven:
            ap.error(f"--parallel: diffusers splits each sequence into {parallel_world()} equal shards; "
                     f"{'; '.join(uneven)} (pick another --num-frames / --height / --width)")
    if args.cuda_graph and (args.train or args.parallel or args.device != "cuda" or args.compile_mode != "default"):
        ap.error("--cuda-graph: inference on one GPU (not --train or --parallel), without --compile-mode (the graph "
                 "holds the compiled blocks; reduce-overhead would be graphs in graphs)")
    if args.compile_mode == "reduce-overhead" and args.compile_scope != "model":
        ap.error("--compile-mode reduce-overhead needs --compile-scope model: the blocks share one compiled "
                 "function, and CUDA graph trees overwrite a block's output when the next block replays")
    if args.interleave and not {"stock-compile", "ours-compile"} <= set(wanted):
        ap.error("--interleave: --configs must hold stock-compile and ours-compile (the pair it times in turns)")
    if args.train and set(wanted) & set(e2e.FP8_CONFIGS):
        ap.error("--configs: the FP8 configurations are inference only, not --train")
    if args.fp8:
        wanted += list(e2e.FP8_CONFIGS)
        if args.device != "cuda":
            ap.error("--fp8: the FP8 GEMMs and their quality check run on a CUDA GPU (--device cuda)")
        if args.train or args.model not in FP8_MODELS:
            ap.error(f"--fp8: inference on --model {' or '.join(FP8_MODELS)} only (the models optimize(fp8=True) "
                     "serves so far)")
    if args.fp8_attention and not (args.fp8 and args.model in FP8_ATTENTION_MODELS):
        ap.error(f"--fp8-attention: only with --fp8 --model {' or '.join(FP8_ATTENTION_MODELS)} (the models whose "
                 "integration takes fp8_attention)")
    if not args.fp8_fuse_qkv and not (args.fp8 and args.model == "ltx"):
        ap.error("--no-fp8-fuse-qkv: only with --fp8 --model ltx (LTX-Video's self-attention q/k/v)")
    unknown = [c for c in wanted if c not in e2e.ALL_CONFIGS]
    if unknown:
        ap.error(f"--configs: unknown {', '.join(unknown)} (of {', '.join(e2e.ALL_CONFIGS)})")
    args.configs = [c for c in e2e.ALL_CONFIGS if c in wanted or c == "stock-eager"]
    args.spec, args.variant = spec, variant
    if args.guidance_scale is None:
        args.guidance_scale = spec.guidance_scale
    return args


# --- the model ------------------------------------------------------------------------------------

def keep_fp32_as_loaded(model):
    """bf16, except what ``from_pretrained(torch_dtype=bf16)`` keeps in float32 (the class's
    ``_keep_in_fp32_modules``, matched per name component as diffusers does: Wan's time embedder,
    modulation tables, norms and RoPE), so random weights run in the dtypes a loaded model does."""
    model.to(torch.bfloat16)
    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point() and any(k in name.split(".") for k in keep):
            tensor.data = tensor.data.float()
    return model


def truncate(model, spec: e2e.Model, units: int):
    """`model` cut to `units` units in place (the last block kept where it is another kind)."""
    for arg, attr, per_unit in spec.depth:
        blocks, keep = getattr(model, attr), units * per_unit
        if len(blocks) == keep:
            continue
        kept = [*blocks[:keep - 1], blocks[-1]] if spec.last_block_differs else list(blocks[:keep])
        setattr(model, attr, torch.nn.ModuleList(kept))
        model.register_to_config(**{arg: keep})
    return model


def build(args):
    """The N-unit transformer every configuration copies: random (seeded) or --weights (local files)."""
    import diffusers

    spec, cls = args.spec, getattr(diffusers, args.spec.cls)
    if args.weights is None:
        torch.manual_seed(args.seed)
        with torch.device(DEVICE):
            model = cls(**args.variant.kwargs, **e2e.depth_kwargs(spec, args.layers))
        return keep_fp32_as_loaded(model).eval()
    subfolder = "transformer" if (args.weights / "transformer" / "config.json").is_file() else None
    model = cls.from_pretrained(args.weights, subfolder=subfolder, torch_dtype=torch.bfloat16, local_files_only=True)
    _, attr, per_unit = spec.depth[0]
    args.full_layers = len(getattr(model, attr)) // per_unit  # the checkout's depth, not the table's
    if not args.scale_requested:
        args.layers = args.full_layers
    if args.layers != args.full_layers and not 2 <= args.layers < args.full_layers:
        sys.exit(f"--layers: 2..{args.full_layers - 1} or {args.full_layers} for {args.weights}")
    return truncate(model, spec, args.layers).to(DEVICE).eval()


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


# --- each pipeline's loop ----------------------------------------------------------------------------

def shift_mu(seq: int, cfg, base_seq=256, max_seq=4096, base_shift=0.5, max_shift=1.15) -> float:
    """The pipelines' calculate_shift: mu linear in the sequence length, from the scheduler's config."""
    b_seq, m_seq = cfg.get("base_image_seq_len", base_seq), cfg.get("max_image_seq_len", max_seq)
    b, m = cfg.get("base_shift", base_shift), cfg.get("max_shift", max_shift)
    return b + (m - b) / (m_seq - b_seq) * (seq - b_seq)


def linear_quadratic_sigmas(steps: int, threshold_noise: float = 0.025) -> list:
    """MochiPipeline's linear_quadratic_schedule (genmo's sampler): linear for the first half, then
    quadratic, as 1 - x."""
    linear = steps // 2
    linear_part = [i * threshold_noise / linear for i in range(linear)]
    diff = linear - threshold_noise * steps
    quadratic = steps - linear
    coef = diff / (linear * quadratic ** 2)
    lin_coef = threshold_noise / linear - 2 * diff / quadratic ** 2
    const = coef * linear ** 2
    return [1.0 - x for x in linear_part + [coef * i ** 2 + lin_coef * i + const for i in range(linear, steps)]]


def rescale_guidance(guided, positive, rescale: float):
    """LTX2Pipeline's rescale_noise_cfg: the guided prediction's std pulled toward the positive's."""
    dims = list(range(1, positive.ndim))
    rescaled = guided * (positive.std(dim=dims, keepdim=True) / guided.std(dim=dims, keepdim=True))
    return rescale * rescaled + (1 - rescale) * guided


def randn(generator, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=generator).to(DEVICE, dtype)


def flow_match(args, **config):
    """FlowMatchEulerDiscreteScheduler as the pipeline's checkpoint configures it (or --weights' own)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    if args.weights is not None and (args.weights / "scheduler" / "scheduler_config.json").is_file():
        import diffusers

        name = json.loads((args.weights / "scheduler" / "scheduler_config.json").read_text())["_class_name"]
        return getattr(diffusers, name).from_pretrained(args.weights, subfolder="scheduler", local_files_only=True)
    return FlowMatchEulerDiscreteScheduler(**config)


class Loop:
    """One pipeline's denoising loop, one step at a time. ``inputs`` are shared by every
    configuration (made once by ``make_inputs``); ``predict(i)`` is the transformer's work of step
    i (every pass), ``step(i)`` adds guidance and the scheduler; ``latents()`` is the state."""

    def __init__(self, model, inputs: dict, args, steps: int):
        self.model, self.inputs, self.args, self.steps = model, inputs, args, steps
        self.scheduler = copy.deepcopy(inputs["scheduler"])
        self.setup()

    @staticmethod
    def make_inputs(model, args) -> dict:
        raise NotImplementedError

    def setup(self):
        raise NotImplementedError

    def predict(self, i: int) -> tuple:
        raise NotImplementedError

    def step(self, i: int) -> None:
        raise NotImplementedError

    def latents(self) -> torch.Tensor:
        return self.state

    def flow_sigmas(self, mu=None):
        self.scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / self.steps, self.steps), mu=mu, device=DEVICE)
        self.scheduler.set_begin_index(0)
        self.timesteps = self.scheduler.timesteps


LTX_SCHEDULER = dict(use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05, base_image_seq_len=1024,
                     max_image_seq_len=4096, shift_terminal=0.1)  # Lightricks/LTX-Video's scheduler config


class LTXLoop(Loop):
    """LTXPipeline: CFG over [negative, positive] in one pass, FlowMatch Euler with shifted sigmas,
    RoPE interpolation scale (VAE temporal / 25 fps, VAE spatial, VAE spatial)."""

    @staticmethod
    def make_inputs(model, args):
        spec, step, v = args.spec, args.step, args.step.videos
        frames, height, width = e2e.latent_grid(spec, step)
        g = torch.Generator().manual_seed(args.seed + 1)
        mask = torch.zeros(2 * v, step.text_tokens)
        mask[:, :step.text_valid or step.text_tokens] = 1
        return {"grid": (frames, height, width), "scheduler": flow_match(args, **LTX_SCHEDULER),
                "latents": randn(g, v, frames * height * width, model.config.in_channels),
                "embeds": randn(g, 2 * v, step.text_tokens, model.config.caption_channels, dtype=torch.bfloat16),
                "mask": mask.to(DEVICE)}

    def setup(self):
        self.state = self.inputs["latents"].clone()
        self.flow_sigmas(shift_mu(self.state.shape[1], self.scheduler.config))

    def predict(self, i):
        frames, height, width = self.inputs["grid"]
        g = self.args.spec.geometry
        x = torch.cat([self.state] * 2).to(torch.bfloat16)
        t = self.timesteps[i]
        return (self.model(hidden_states=x, encoder_hidden_states=self.inputs["embeds"], timestep=t.expand(x.shape[0]),
                           encoder_attention_mask=self.inputs["mask"], num_frames=frames, height=height, width=width,
                           rope_interpolation_scale=(g.vae_temporal / 25, g.vae_spatial, g.vae_spatial),
                           return_dict=False)[0],)

    def step(self, i):
        uncond, text = self.predict(i)[0].float().chunk(2)
        noise = uncond + self.args.guidance_scale * (text - uncond)
        self.state = self.scheduler.step(noise, self.timesteps[i], self.state, return_dict=False)[0]


class LTX2Loop(Loop):
    """LTX2Pipeline's classifier-free guidance: video and audio in one pass over [negative, positive],
    guidance as a delta in x0 space, rescaled by 0.7 (audio scale 7), FlowMatch Euler per stream.
    Positions from the transformer's RoPE modules at 24 fps; the connectors' all-ones text mask."""

    AUDIO_SCALE, RESCALE, FPS = 7.0, 0.7, 24.0

    @staticmethod
    def make_inputs(model, args):
        spec, step, v = args.spec, args.step, args.step.videos
        frames, height, width = e2e.latent_grid(spec, step)
        audio = e2e.audio_tokens(spec, step)
        c = model.config
        g = torch.Generator().manual_seed(args.seed + 1)
        rope_v = model.rope.prepare_video_coords(v, frames, height, width, torch.device(DEVICE), fps=LTX2Loop.FPS)
        rope_a = model.audio_rope.prepare_audio_coords(v, audio, torch.device(DEVICE))
        return {"grid": (frames, height, width), "audio": audio, "scheduler": flow_match(args, **LTX_SCHEDULER),
                "latents": randn(g, v, frames * height * width, c.in_channels),
                "audio_latents": randn(g, v, audio, c.audio_in_channels),
                "embeds": randn(g, 2 * v, step.text_tokens, c.caption_channels, dtype=torch.bfloat16),
                "audio_embeds": randn(g, 2 * v, step.text_tokens, c.caption_channels, dtype=torch.bfloat16),
                # all ones: under --parallel no mask, the same attention (diffusers 0.42.1's Ulysses fails
                # on a text mask, stock too)
                "mask": None if args.parallel else torch.ones(2 * v, step.text_tokens, dtype=torch.int64,
                                                              device=DEVICE),
                "video_coords": rope_v.repeat((2,) + (1,) * (rope_v.ndim - 1)),
                "audio_coords": rope_a.repeat((2,) + (1,) * (rope_a.ndim - 1))}

    def setup(self):
        self.state = self.inputs["latents"].clone()
        self.audio_state = self.inputs["audio_latents"].clone()
        mu = shift_mu(self.state.shape[1], self.scheduler.config, 1024, 4096, 0.95, 2.05)
        self.flow_sigmas(mu)
        self.audio_scheduler = copy.deepcopy(self.scheduler)

    def predict(self, i):
        frames, height, width = self.inputs["grid"]
        x = torch.cat([self.state] * 2).to(torch.bfloat16)
        ax = torch.cat([self.audio_state] * 2).to(torch.bfloat16)
        t = self.timesteps[i].expand(x.shape[0])
        return self.model(hidden_states=x, audio_hidden_states=ax, encoder_hidden_states=self.inputs["embeds"],
                          audio_encoder_hidden_states=self.inputs["audio_embeds"], timestep=t, sigma=t,
                          encoder_attention_mask=self.inputs["mask"], audio_encoder_attention_mask=self.inputs["mask"],
                          num_frames=frames, height=height, width=width, fps=self.FPS,
                          audio_num_frames=self.inputs["audio"], video_coords=self.inputs["video_coords"],
                          audio_coords=self.inputs["audio_coords"], isolate_modalities=False,
                          spatio_temporal_guidance_blocks=None, perturbation_mask=None, use_cross_timestep=True,
                          return_dict=False)

    def guide(self, prediction, state, scheduler, i, scale):
        sigma = scheduler.sigmas[i]
        uncond, text = prediction.float().chunk(2)
        x0, x0_uncond = state - text * sigma, state - uncond * sigma
        guided = rescale_guidance(x0 + (scale - 1) * (x0 - x0_uncond), x0, self.RESCALE)
        return scheduler.step((state - guided) / sigma, self.timesteps[i], state, return_dict=False)[0]

    def step(self, i):
        video, audio = self.predict(i)
        self.state = self.guide(video, self.state, self.scheduler, i, self.args.guidance_scale)
        self.audio_state = self.guide(audio, self.audio_state, self.audio_scheduler, i, self.AUDIO_SCALE)

    def latents(self):
        return torch.cat([self.state.flatten(), self.audio_state.flatten()])


class WanLoop(Loop):
    """WanPipeline / WanImageToVideoPipeline (Wan 2.1): two passes per step (positive, then negative
    prompt), UniPC multistep with flow sigmas, flow_shift 3.0 (480P). Image-to-video concatenates the
    condition latents (4 mask + 16 VAE channels) and passes the CLIP image states (257 x 1280)."""

    @staticmethod
    def make_inputs(model, args):
        from diffusers import UniPCMultistepScheduler

        step, v, c = args.step, args.step.videos, model.config
        frames, height, width = e2e.latent_grid(args.spec, step)
        g = torch.Generator().manual_seed(args.seed + 1)
        channels = c.out_channels
        inputs = {"latents": randn(g, v, channels, frames, height, width),
                  "embeds": randn(g, v, step.text_tokens, c.text_dim, dtype=torch.bfloat16),
                  "negative": randn(g, v, step.text_tokens, c.text_dim, dtype=torch.bfloat16)}
        if c.image_dim is not None:
            inputs["condition"] = randn(g, v, c.in_channels - channels, frames, height, width)
            inputs["image"] = randn(g, v, 257, c.image_dim, dtype=torch.bfloat16)
        scheduler = (flow_match(args) if args.weights is not None else
                     UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                             num_train_timesteps=1000, flow_shift=3.0))
        return {**inputs, "scheduler": scheduler}

    def setup(self):
        self.state = self.inputs["latents"].clone()
        self.scheduler.set_timesteps(self.steps, device=DEVICE)
        self.scheduler.set_begin_index(0)
        self.timesteps = self.scheduler.timesteps

    def predict(self, i):
        x = self.state
        if "condition" in self.inputs:
            x = torch.cat([x, self.inputs["condition"]], dim=1)
        x, t = x.to(torch.bfloat16), self.timesteps[i].expand(self.state.shape[0])
        image = {"encoder_hidden_states_image": self.inputs["image"]} if "image" in self.inputs else {}
        return tuple(self.model(hidden_states=x, timestep=t, encoder_hidden_states=self.inputs[key], **image,
                                return_dict=False)[0] for key in ("embeds", "negative"))

    def step(self, i):
        cond, uncond = self.predict(i)
        noise = uncond + self.args.guidance_scale * (cond - uncond)
        self.state = self.scheduler.step(noise, self.timesteps[i], self.state, return_dict=False)[0]


class MochiLoop(Loop):
    """MochiPipeline: CFG over [negative, positive] in one pass, genmo's linear-quadratic sigmas on
    FlowMatch Euler with inverted sigmas (so timesteps rise from 0), guidance and scheduler in
    float32, latents in the prompt's dtype (bf16)."""

    @staticmethod
    def make_inputs(model, args):
        step, v, c = args.step, args.step.videos, model.config
        frames, height, width = e2e.latent_grid(args.spec, step)
        g = torch.Generator().manual_seed(args.seed + 1)
        mask = torch.zeros(2 * v, step.text_tokens, dtype=torch.int64)
        mask[:, :step.text_valid or step.text_tokens] = 1
        return {"scheduler": flow_match(args, invert_sigmas=True),
                "latents": randn(g, v, c.in_channels, frames, height, width, dtype=torch.bfloat16),
                "embeds": randn(g, 2 * v, step.text_tokens, c.text_embed_dim, dtype=torch.bfloat16),
                "mask": mask.to(DEVICE)}

    def setup(self):
        self.state = self.inputs["latents"].clone()
        self.scheduler.set_timesteps(sigmas=np.array(linear_quadratic_sigmas(self.steps)), device=DEVICE)
        self.scheduler.set_begin_index(0)
        self.timesteps = self.scheduler.timesteps

    def predict(self, i):
        x = torch.cat([self.state] * 2)
        t = self.timesteps[i].expand(x.shape[0]).to(x.dtype)
        return (self.model(hidden_states=x, encoder_hidden_states=self.inputs["embeds"], timestep=t,
                           encoder_attention_mask=self.inputs["mask"], return_dict=False)[0],)

    def step(self, i):
        uncond, text = self.predict(i)[0].float().chunk(2)
        noise = uncond + self.args.guidance_scale * (text - uncond)
        dtype = self.state.dtype
        self.state = self.scheduler.step(noise, self.timesteps[i], self.state.float(), return_dict=False)[0].to(dtype)


FLUX_SCHEDULER = dict(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096, max_shift=1.15, shift=3.0,
                      use_dynamic_shifting=True)  # black-forest-labs/FLUX.1-dev's scheduler config


class FluxLoop(Loop):
    """FluxPipeline (FLUX.1-dev): guidance-distilled, one pass with the guidance scale embedded,
    2x2-packed latents with their position ids, timestep / 1000, FlowMatch Euler with the shift
    for the image's sequence length; latents in the prompt's dtype (bf16)."""

    @staticmethod
    def make_inputs(model, args):
        step, v, c = args.step, args.step.videos, model.config
        _, height, width = e2e.latent_grid(args.spec, step)
        p = args.spec.geometry.patch_spatial
        g = torch.Generator().manual_seed(args.seed + 1)
        ids = torch.zeros(height // p, width // p, 3)
        ids[..., 1] += torch.arange(height // p)[:, None]
        ids[..., 2] += torch.arange(width // p)[None, :]
        return {"scheduler": flow_match(args, **FLUX_SCHEDULER),
                "latents": randn(g, v, (height // p) * (width // p), c.in_channels, dtype=torch.bfloat16),
                "embeds": randn(g, v, step.text_tokens, c.joint_attention_dim, dtype=torch.bfloat16),
                "pooled": randn(g, v, c.pooled_projection_dim, dtype=torch.bfloat16),
                "txt_ids": torch.zeros(step.text_tokens, 3, device=DEVICE, dtype=torch.bfloat16),
                "img_ids": ids.reshape(-1, 3).to(DEVICE, torch.bfloat16),
                "guidance": (torch.full([v], args.guidance_scale, device=DEVICE) if c.guidance_embeds else None)}

    def setup(self):
        self.state = self.inputs["latents"].clone()
        self.flow_sigmas(shift_mu(self.state.shape[1], self.scheduler.config))

    def predict(self, i):
        t = self.timesteps[i].expand(self.state.shape[0]).to(self.state.dtype)
        return (self.model(hidden_states=self.state, timestep=t / 1000, guidance=self.inputs["guidance"],
                           pooled_projections=self.inputs["pooled"], encoder_hidden_states=self.inputs["embeds"],
                           txt_ids=self.inputs["txt_ids"], img_ids=self.inputs["img_ids"], return_dict=False)[0],)

    def step(self, i):
        self.state = self.scheduler.step(self.predict(i)[0], self.timesteps[i], self.state, return_dict=False)[0]


LOOPS = {"ltx": LTXLoop, "ltx2": LTX2Loop, "wan": WanLoop, "mochi": MochiLoop, "flux": FluxLoop}


# --- attention backends -------------------------------------------------------------------------------

@contextlib.contextmanager
def attention_scope(backend: str):
    """While measuring with `backend`: diffusers' active backend (restored afterwards; processors
    without one of their own follow it) and, for processors that call F.scaled_dot_product_attention
    themselves, PyTorch's SDPA backend."""
    from diffusers.models.attention_dispatch import attention_backend

    with contextlib.ExitStack() as stack:
        stack.enter_context(attention_backend(DIFFUSERS_BACKENDS[backend]))
        if backend in SDPA_BACKENDS:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[backend])]))
        yield


def set_attention(model, backend: str) -> None:
    """diffusers' seam: every attention processor with a backend attribute runs `backend` (without
    diffusers' "experimental feature" warning at every call)."""
    from diffusers.models import modeling_utils

    level = modeling_utils.logger.level
    modeling_utils.logger.setLevel("ERROR")
    try:
        if backend == "native":
            model.reset_attention_backend()
        else:
            model.set_attention_backend(DIFFUSERS_BACKENDS[backend])
    finally:
        modeling_utils.logger.setLevel(level)


def rel_l2(got: torch.Tensor, expected: torch.Tensor) -> float:
    got, expected = got.double(), expected.double()
    return ((got - expected).norm() / expected.norm()).item()


def flat(outputs: tuple) -> torch.Tensor:
    return torch.cat([o.float().flatten() for o in outputs])


def probe_ms(step) -> float:
    """ms per call of ``step(i)`` over PROBE_STEPS calls (after the caller's warm-up)."""
    sync()
    start = time.perf_counter()
    for i in range(PROBE_STEPS):
        step(i)
    sync()
    return (time.perf_counter() - start) * 1e3 / PROBE_STEPS


def inference_probe(base, inputs: dict, args):
    """``measure(backend)`` for probe_attention: the stock eager loop's first-step output, and ms per
    step over PROBE_STEPS steps."""
    loop_cls = LOOPS[args.model]

    def measure(name: str) -> tuple[torch.Tensor, float]:
        with torch.no_grad():
            loop = loop_cls(base, inputs, args, max(PROBE_STEPS, 2))
            out = flat(loop.predict(0))  # also the warm-up
            return out, probe_ms(loop.step)

    return base, measure


def train_probe(base, inputs: dict, args):
    """``measure(backend)`` for probe_attention under --train: a stock eager LoRA step (forward and
    backward, where the attention's backward can cost more than its forward), its adapters' grads,
    and ms per step over PROBE_STEPS steps. Inference timings pick a backend whose backward can be
    several times slower (LTX-Video: memory-efficient against cuDNN, 117 against 31 ms a step)."""
    model = copy.deepcopy(base)
    step = TrainStep(model, step_kwargs(model, inputs, args), add_lora(model, args), args.seed)

    def measure(name: str) -> tuple[torch.Tensor, float]:
        step.step()  # the warm-up
        return step.grads(), probe_ms(step.step)

    return model, measure


def probe_attention(base, inputs: dict, args) -> dict:
    """Each backend on the stock eager model (under --train its LoRA step): the first step's output
    (the adapters' grads) against native's and ms per step over PROBE_STEPS steps; a backend that
    refuses the model's calls is listed with why."""
    model, measure = (train_probe if args.train else inference_probe)(base, inputs, args)
    results, reference = [], None
    for name in e2e.ATTENTION_BACKENDS:
        entry = {"backend": name}
        try:
            with attention_scope(name):
                set_attention(model, name)
                out, ms = measure(name)
            entry["ms_per_step"] = round(ms, 3)
            if reference is None and name == "native":
                reference = out
            entry["rel_l2_vs_native"] = rel_l2(out, reference) if reference is not None else None
            ok = entry["rel_l2_vs_native"] is not None and entry["rel_l2_vs_native"] <= args.attention_tolerance
            entry["status"] = "ok" if ok else "outside tolerance"
        except Exception as e:  # a backend refusing a shape, a mask or the device
            entry["status"] = f"refused: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        finally:
            set_attention(model, "native")
        print(f"   attention {name}: " + (f"{entry['ms_per_step']:.1f} ms/step, rel. L2 vs native "
                                         f"{entry['rel_l2_vs_native']:.1e}, {entry['status']}"
                                         if "ms_per_step" in entry and entry["rel_l2_vs_native"] is not None
                                         else entry["status"]), flush=True)
        results.append(entry)
    del model
    ok = [r for r in results if r["status"] == "ok"]
    if args.attention_backend == "auto":
        chosen, why = min(ok, key=lambda r: r["ms_per_step"])["backend"] if ok else "native", "fastest within tolerance"
    elif any(r["backend"] == args.attention_backend and "ms_per_step" in r for r in results):
        chosen, why = args.attention_backend, "requested"
    else:
        chosen, why = "native", f"requested {args.attention_backend}, which refused this model"
    print(f"   attention backend for every configuration: {chosen} ({why})", flush=True)
    return {"requested": args.attention_backend, "chosen": chosen, "why": why,
            "tolerance": float(args.attention_tolerance), "probe_steps": PROBE_STEPS,
            "measured_on": f"stock eager{' LoRA step' if args.train else ''}, {args.layers} layers",
            "backends": results}


# --- --parallel: context parallelism under torchrun (issue 38) ----------------------------------------

def parallel_world() -> int:
    """The number of processes torchrun started (1 without torchrun)."""
    import os

    return int(os.environ.get("WORLD_SIZE", "1"))


def parallel_uneven(spec, step, n: int) -> list:
    """The sequences (video, audio, text tokens) context parallelism over ``n`` ranks would split
    unevenly: diffusers 0.42.1's sharder asserts equal shards. LTX-2's 121 frames carry 126 audio tokens."""
    lengths = {"video tokens": e2e.tokens(spec, step), "text tokens": step.text_tokens,
               "audio tokens": e2e.audio_tokens(spec, step)}
    return [f"{length} {name} do not divide by {n}" for name, length in lengths.items()
            if length is not None and length % n]


def start_parallel() -> int:
    """Join the NCCL group torchrun set up, on this rank's GPU; ranks other than 0 print nothing.
    Returns the rank."""
    import os

    import torch.distributed as dist

    import atexit

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    atexit.register(dist.destroy_process_group)
    if dist.get_rank() != 0:
        sys.stdout = sys.stderr = open(os.devnull, "w")
    return dist.get_rank()


def parallel_record(rows: list, args) -> dict:
    """Each configuration on one GPU against the same under context parallelism: speedup and scaling
    efficiency (one-GPU time / (N x N-GPU time)); issue 38's targets."""
    n = parallel_world()
    by = e2e.measured_rows(rows)
    scaling = {}
    for key, row in by.items():
        cp = by.get(f"{key}-cp")
        if cp is not None:
            speedup = row["ms_per_step"] / cp["ms_per_step"]
            scaling[key] = {"one_gpu_ms": row["ms_per_step"], "parallel_ms": cp["ms_per_step"],
                            "speedup": round(speedup, 3), "efficiency": round(speedup / n, 3)}
    targets = {}
    for kind in ("eager", "compile"):
        stock, ours = scaling.get(f"stock-{kind}"), scaling.get(f"ours-{kind}")
        if stock and ours:
            margin_1 = stock["one_gpu_ms"] / ours["one_gpu_ms"]
            margin_n = stock["parallel_ms"] / ours["parallel_ms"]
            targets[f"ours_{kind}_parallel_margin_at_least_one_gpu_margin"] = {
                "one_gpu": round(margin_1, 3), "parallel": round(margin_n, 3), "met": margin_n >= margin_1}
        if ours and n == 2 and args.model == "wan":  # the scaling target is Wan's
            targets[f"ours_{kind}_two_gpu_speedup_at_least_1.8"] = {"value": ours["speedup"],
                                                                    "met": ours["speedup"] >= 1.8}
    for key, entry in scaling.items():
        print(f"   {key}: one GPU {entry['one_gpu_ms']:.1f} ms, {args.parallel} x{n} {entry['parallel_ms']:.1f} ms: "
              f"{entry['speedup']:.2f}x, efficiency {entry['efficiency']:.0%}", flush=True)
    return {"mode": args.parallel, "world": n, "backend": "ring: diffusers' _native_cudnn (it returns the LSE)"
            if args.parallel == "ring" else "the run's", "scaling": scaling, "targets": targets}


# --- ours -------------------------------------------------------------------------------------------

def load_kernel(args):
    return kernel_loading.load(dev=args.dev_build)


class Ours:
    """``optimize`` where ltx_kernels_diffusers has it, else ``optimize_ltx``; the kernel loaded at
    first use. ``status``: "ok", e2e.OURS_NOT_SUPPORTED (the entry point refused the model) or
    "unavailable" (no integration, no kernel, or it stepped aside), with ``reason``."""

    def __init__(self, args):
        self.args, self.kernel, self.status, self.reason, self.entry = args, None, "ok", None, None
        try:
            import ltx_kernels_diffusers as integration
        except ImportError as e:
            self.status, self.reason = "unavailable", f"ltx_kernels_diffusers: {e}"
            return
        self.integration = integration
        # `optimize` once the integration has the entry point for every model (a function: in older versions
        # the name is the submodule optimize.py)
        entry = getattr(integration, "optimize", None)
        self.fn = entry if callable(entry) else integration.optimize_ltx
        self.entry = self.fn.__name__

    def apply(self, model, fp8: bool = False) -> bool:
        """Optimise `model` in place (``fp8``: with ``fp8=True``); False (and the status says why) where it
        cannot."""
        if self.status != "ok":
            return False
        if self.kernel is None:
            try:
                self.kernel = load_kernel(self.args)
            except (Exception, SystemExit) as e:  # no build, or no GPU it can run on
                self.status, self.reason = "unavailable", f"kernel: {e}"
                return False
        options = {"gelu_epilogue": self.args.gelu_epilogue} if self.args.model in GELU_EPILOGUE_MODELS else {}
        if self.args.train:  # the stock configurations' attention (and its backward), so the grads compare ours
            options["prefer_cudnn_attention"] = False
        if self.args.cuda_graph:
            options["cuda_graph"] = True
        if fp8:
            options.update(fp8=True, fp8_fast_accum=self.args.fp8_fast_accum)
            if self.args.model == "ltx":
                options["fp8_fuse_qkv"] = self.args.fp8_fuse_qkv
            if self.args.fp8_attention:
                options["fp8_attention"] = True
        try:
            self.fn(model, kernel=self.kernel, exact_mode=self.args.kernel_mode == "exact", **options)
        except self.integration.UnsupportedModelError as e:
            self.status, self.reason = e2e.OURS_NOT_SUPPORTED, str(e)
            return False
        if not self.integration.is_optimized(model):
            self.status, self.reason = "unavailable", f"{self.entry} left the model stock (it stepped aside)"
            return False
        return True

    def record(self) -> dict:
        return {"status": self.status, "entry": self.entry, "reason": self.reason,
                "kernel_mode": self.args.kernel_mode,
                **({"prefer_cudnn_attention": False} if self.args.train else {}),
                **({"gelu_epilogue": self.args.gelu_epilogue} if self.args.model in GELU_EPILOGUE_MODELS else {}),
                **({"fp8_fast_accum": self.args.fp8_fast_accum} if self.args.fp8 else {}),
                **({"fp8_fuse_qkv": self.args.fp8_fuse_qkv} if self.args.fp8 and self.args.model == "ltx" else {}),
                **({"fp8_attention": True} if self.args.fp8_attention else {}),
                **({"cuda_graph": True} if self.args.cuda_graph else {})}


# --- FP8 (issue 37) ---------------------------------------------------------------------------------

FP8_MODELS = ("ltx", "ltx2", "wan", "mochi", "flux")  # the models whose integration takes fp8=True
FP8_ATTENTION_MODELS = ("ltx2", "wan", "mochi", "flux")  # ... and fp8_attention=True


class Fp32Run(torch.nn.Module):
    """An fp32 model called with the loop's bf16 inputs: floating tensors go in as float32."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, **kwargs):
        return self.model(**fp32_kwargs(kwargs))


def fp8_quality(base, inputs, ours: Ours, args) -> dict:
    """Issue 37's quality report on the N-layer model's first denoising step (eager): the transformer
    output of stock bf16, ours bf16, ours fp8 and torchao fp8 as relative L2 to the fp32 stock model's
    (bar: 3x stock bf16's); and per block linear, on that step's activations in stock bf16, the FP8
    GEMM's relative L2 to float64 against bf16's (mean and max over blocks)."""
    import torch.nn.functional as F

    loop_cls = LOOPS[args.model]

    def first(model):
        with torch.no_grad():
            return flat(loop_cls(model, inputs, args, 2).predict(0))

    reference = first(Fp32Run(copy.deepcopy(base).float()))
    torch.cuda.empty_cache()
    kernel = ours.kernel or load_kernel(args)
    errors: dict = {}

    def record(path):
        def hook(module, hook_args, out):
            x = hook_args[0]
            w, b = module.weight, module.bias
            ref = F.linear(x.double(), w.double(), None if b is None else b.double())
            fp8 = kernel.linear_fp8(x, kernel.quantize_fp8(w), b, fast_accum=args.fp8_fast_accum)
            errors.setdefault(path, []).append((rel_l2(out, ref), rel_l2(fp8, ref)))
        return hook

    from ltx_kernels_diffusers import fp8_linear_names

    stock = copy.deepcopy(base)
    # per linear of a block (the name without "transformer_blocks.<i>."; Flux's single blocks: "single ...")
    handles = [stock.get_submodule(name).register_forward_hook(
        record(("single " if name.startswith("single_") else "") + name.split(".", 2)[2]))
        for name in fp8_linear_names(stock)]
    outputs = {"stock bf16": first(stock)}
    for h in handles:
        h.remove()
    del stock
    for key, label in (("ours-eager", "ours bf16"), ("ours-fp8-eager", "ours fp8")):
        model = prepare(key, base, ours, "native", args)
        if model is not None:
            outputs[label] = first(model)
        del model
    try:
        model = copy.deepcopy(base)
        torchao_fp8(model)
        outputs["torchao fp8"] = first(model)
        del model
    except Exception as e:  # noqa: BLE001 - torchao missing or refusing: say so
        outputs["torchao fp8"] = f"{type(e).__name__}: {str(e)[:200]}"
    torch.cuda.empty_cache()
    model_errors = {label: (rel_l2(out, reference) if isinstance(out, torch.Tensor) else out)
                    for label, out in outputs.items()}
    stock_error = model_errors["stock bf16"]
    per_layer = [{"linear": path, "blocks": len(pairs),
                  "bf16_rel_l2_mean": statistics.mean(p[0] for p in pairs), "fp8_rel_l2_mean": statistics.mean(
                      p[1] for p in pairs), "fp8_rel_l2_max": max(p[1] for p in pairs)}
                 for path, pairs in errors.items()]
    for label, err in model_errors.items():
        print(f"   {label}: relative L2 to fp32 {err if isinstance(err, str) else f'{err:.4g}'}"
              + (f" ({err / stock_error:.2f}x stock bf16)" if isinstance(err, float) else ""), flush=True)
    for row in per_layer:
        print(f"   {row['linear']:16s} GEMM rel. L2 to float64: bf16 {row['bf16_rel_l2_mean']:.2e}, fp8 "
              f"{row['fp8_rel_l2_mean']:.2e} (max {row['fp8_rel_l2_max']:.2e})", flush=True)
    ours_fp8 = model_errors.get("ours fp8")
    return {"layers": args.layers, "step": "first denoising step, transformer output (both CFG halves)",
            "reference": "fp32 stock model, same weights and inputs", "rel_l2_to_fp32": model_errors,
            "bar": e2e.TARGET_FP8_QUALITY_RATIO,
            "met": None if not isinstance(ours_fp8, float) else ours_fp8 <= e2e.TARGET_FP8_QUALITY_RATIO * stock_error,
            "per_linear": per_layer, "fast_accum": args.fp8_fast_accum}


def torchao_fp8(model) -> None:
    """torchao's float8 dynamic-activation / float8-weight rowwise config on the linears ours converts."""
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

    from ltx_kernels_diffusers import fp8_linear_names

    names = set(fp8_linear_names(model))
    quantize_(model, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()),
              filter_fn=lambda module, fqn: fqn in names)


# --- measuring ----------------------------------------------------------------------------------------

def kernel_category(name: str) -> str:
    lowered = name.lower()
    # Inductor names a pointwise or reduction kernel after the ops it fused, SDPA included when it wrote
    # the attention's inputs (q/k norm + RoPE); until 2026-11-28 those counted as attention.
    if lowered.startswith(INDUCTOR_ELEMENTWISE):
        return "other"
    if any(k in lowered for k in ATTENTION_KERNELS):
        return "attention"
    if any(k in lowered for k in GEMM_KERNELS):
        return "gemm"
    return "other"


def category_fields(ms: dict) -> dict:
    """A profile's split from device ms per category: ``gemm_ms``, ``attention_ms``, ``other_ms`` and
    ``floor_ms`` (GEMM + attention)."""
    out = {f"{category}_ms": round(ms[category], 3) for category in e2e.CATEGORIES}
    return {**out, "floor_ms": round(out["gemm_ms"] + out["attention_ms"], 3)}


def profile_step(run: Loop, index: int) -> dict:
    """Device time of one step by kernel category and by kernel name (ms), the number of device
    operations (kernels, memsets, copies: each a launch the host paid for; more than the GPU hides
    makes a step host-bound) in all and by kernel name, the step's wall time, and where collectives ran
    (``e2e.collective_split``). On the CPU it profiles CPU ops instead (nested ops count twice:
    only to try the script)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = DEVICE == "cuda"
    device_type = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    sync()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        run.step(index)
        sync()
    wall_ms = (time.perf_counter() - start) * 1e3
    totals = dict.fromkeys(e2e.CATEGORIES, 0.0)
    counts, us_by_name, category = {}, {}, {}  # by name (first 120 characters)
    spans = []  # (start µs, end µs, an NCCL kernel): under --parallel, how much NCCL time no compute hides
    for event in prof.events():
        if event.device_type != device_type:
            continue
        name, us, kind = event.name[:120], event.time_range.elapsed_us(), kernel_category(event.name)
        category.setdefault(name, kind)
        totals[kind] += us
        counts[name] = counts.get(name, 0) + 1
        us_by_name[name] = us_by_name.get(name, 0.0) + us
        if cuda:
            spans.append((event.time_range.start, event.time_range.end, "nccl" in name.lower()))
    busiest = sorted(us_by_name.items(), key=lambda kv: -kv[1])
    return {**category_fields({k: v / 1e3 for k, v in totals.items()}),
            **e2e.collective_split(spans), **e2e.timeline_split(spans),
            "kernels_ms": round(sum(totals.values()) / 1e3, 3),
            "launches": sum(counts.values()), "profiled_wall_ms": round(wall_ms, 3),
            "launch_counts": dict(sorted(counts.items(), key=lambda kv: -kv[1])),
            "kernel_ms": {n: round(us / 1e3, 4) for n, us in busiest},
            "top_kernels": [{"name": n, "ms": round(us / 1e3, 3), "category": category[n]} for n, us in busiest[:8]]}


def config_label(name: str, units: int) -> str:
    """A configuration at a depth, as its progress lines say it and the profile pass keys it."""
    return f"{name}, {units} layer{'s' if units > 1 else ''}"


def profile_here(args) -> bool:
    """Whether this process profiles a step of each configuration right after timing it: on the CPU
    and under --parallel; on a GPU the profile pass does (profile_pass)."""
    return args.profile and (DEVICE != "cuda" or bool(args.parallel))


def profile_pass(args, backend: str) -> dict | None:
    """Every configuration rebuilt, warmed up and one step profiled in a child process of this script,
    after everything here was timed: a profiler leaves CUPTI attached and slows every later launch, in
    this process and, while the child lives, in its parent (docs/performance.md#profiled-steps).
    Returns the profiles by configuration label, or None where the pass failed."""
    print("\n== profiled steps, one per configuration, in a process of their own after the timing", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profiles.json"
        command = [sys.executable, "-m", "benchmarks.generate_video", *args.argv, "--attention-backend", backend,
                   "--profile-into", str(path)]
        # this process's working directory (relative --weights paths), with the repository importable
        root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
        done = subprocess.run(command, env=env)
        if done.returncode != 0 or not path.is_file():
            print(f"   the profile pass failed (exit {done.returncode}): no GPU split", flush=True)
            args.profile_failed = done.returncode
            return None
        return json.loads(path.read_text())


def attach_profiles(rows: list, args, backend: str) -> None:
    """On a GPU, after the timing: each measured row's profiles from profile_pass, scaled to full depth
    as its times are; prints each row's split."""
    if not args.profile or profile_here(args):
        return
    profiles = profile_pass(args, backend)
    if profiles is None:
        return
    n, full = args.layers, args.full_layers
    for row in rows:
        if "ms_per_step" not in row:
            continue
        measured = profiles.get(config_label(row["config"], n))
        baseline = profiles.get(config_label(row["config"], 1)) if n != full else None
        if measured is None or (n != full and baseline is None):
            print(f"   {row['config']}: not in the profile pass", flush=True)
            continue
        row["measured"]["profile"] = measured
        if baseline:
            row["baseline"]["profile"] = baseline
        row["profile"] = e2e.scale_profile(measured, baseline, n, full)
        print(f"   {row['config']}{split_note(row['profile'])}", flush=True)


def profiled(args) -> str:
    """The result's record of where the profiled steps ran."""
    if not args.profile:
        return "no"
    if profile_here(args):
        return "this process, after each timing"
    failed = args.profile_failed
    return f"no (the profile pass failed: exit {failed})" if failed is not None else "own process, after the timing"


def run_profile_pass(args, sources: dict, inputs: dict) -> None:
    """--profile-into PATH (profile_pass's child): each configuration as the timing process builds it,
    warmed up, one step profiled, nothing timed; the profiles by label into PATH."""
    ours, backend = Ours(args), args.attention_backend
    if args.train:
        kwargs, init, reference = lora_setup(args, sources, inputs)
        for key in args.configs:
            measure_train(key, sources, ours, backend, kwargs, init, reference, args)
    else:
        for key in args.configs:
            measure(key, sources, ours, backend, inputs, args)
    args.profile_into.write_text(json.dumps(args.profiles))


def below_zero(profile: dict) -> str:
    """A warning where scaled profile figures came out below zero (e2e.below_zero), or ""."""
    names = e2e.below_zero(profile)
    return f" [{', '.join(names)} scaled below zero: noise, not time; measure more layers]" if names else ""


def gaps_note(profile: dict) -> str:
    """``; kernels K over S (G idle)`` where the profile has the device timeline."""
    return f"; {kernel_timeline(profile)}" if "gpu_span_ms" in profile else ""


def progress(total: int, desc: str):
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="step", leave=False)


def setup_suffix(args) -> str:
    """The result file's mark of a compile setup (or FP8 q/k/v split, FP8 attention, fast kernel mode) other
    than the default (so it does not replace that run)."""
    mode = "" if args.compile_mode == "default" else f"-{args.compile_mode}"
    # reduce-overhead needs the whole model compiled, so its name already says so
    scope = "-model-scope" if args.compile_scope == "model" and args.compile_mode != "reduce-overhead" else ""
    return (mode + scope + ("-cpp-wrapper" if args.cpp_wrapper else "")
            + ("-skip-guards" if args.skip_guard_eval else "") + ("" if args.fp8_fuse_qkv else "-no-fuse-qkv")
            + ("-fp8-attention" if args.fp8_attention else "")
            + ("-cuda-graph" if args.cuda_graph else "") + ("-fast" if args.kernel_mode == "fast" else ""))


def setup_options(args) -> dict:
    """The result's record of the compile setups other than the default (render.compile_note reads it)."""
    return {**({"cpp_wrapper": True} if args.cpp_wrapper else {}),
            **({"skip_guard_eval": True} if args.skip_guard_eval else {})}


def compile_model(model, args, fullgraph: bool):
    mode = None if args.compile_mode == "default" else args.compile_mode
    if args.cpp_wrapper:  # read when each graph compiles (at its first call)
        import torch._inductor.config

        torch._inductor.config.cpp_wrapper = True
    if args.compile_scope == "model":
        model.compile(fullgraph=fullgraph, mode=mode)
        return
    for module in model.modules():
        if type(module).__name__ in args.spec.blocks:
            module.compile(fullgraph=fullgraph, mode=mode)


def prepare(key: str, source, ours: Ours, backend: str, args, fullgraph: bool = True, parallel: bool = False):
    """A fresh copy of `source` for configuration `key`: optimised (or None where ours cannot),
    then the attention backend, with ``parallel`` diffusers' context parallelism (--parallel, over
    every rank), then compiled."""
    _, kernels, compiled = e2e.ALL_CONFIGS[key]
    model = copy.deepcopy(source)
    if kernels and not ours.apply(model, fp8=key in e2e.FP8_CONFIGS):
        return None
    if key == "torchao-fp8-compile":
        torchao_fp8(model)
    set_attention(model, backend)
    if parallel:
        from diffusers import ContextParallelConfig
        from ltx_kernels_diffusers import context_parallel_plan

        model.enable_parallelism(config=ContextParallelConfig(**{f"{args.parallel}_degree": parallel_world()}),
                                 cp_plan=context_parallel_plan(model))
    if compiled:
        compile_model(model, args, fullgraph)
    return model


def graph_step(args) -> None:
    """Under --compile-mode reduce-overhead, a denoising step starts a new generation of CUDA graph
    outputs: the previous step's are dead once the scheduler has read them."""
    if args.compile_mode == "reduce-overhead":
        torch.compiler.cudagraph_mark_step_begin()


def time_run(warm, make_run, args, label: str, built: float, also_back_to_back: bool = False) -> tuple[dict, object]:
    """Warm up ``warm`` (args.warmup_iterations steps), then time args.steps steps of the loop
    ``make_run()`` gives, synchronised after each, with a progress bar (or a line a step on stderr).
    The peak memory statistics restart before the timed steps (a training step reads them). Returns
    ms per step (mean and median) with the warm-up's seconds since ``built``, and the timed loop.
    ``also_back_to_back``: also time args.steps steps of a fresh loop with one synchronisation at the end,
    as a pipeline runs them, so the host prepares step i + 1 while the device runs step i."""
    warm_up(warm, args)
    warmup_s = time.perf_counter() - built
    with guard_stance(args):
        return timed(make_run, args, label, warmup_s, also_back_to_back)


def warm_up(warm, args) -> None:
    """args.warmup_iterations untimed steps of ``warm`` (compilation happens here)."""
    for i in range(args.warmup_iterations):
        graph_step(args)
        warm.step(i)
    sync()


def guard_stance(args):
    """The compiler stance the timed steps run under: --skip-guard-eval's, else none."""
    if args.skip_guard_eval:
        return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
    return contextlib.nullcontext()


def step_ms(run, i: int, args) -> float:
    """Wall ms of ``run.step(i)``, synchronised after it."""
    start = time.perf_counter()
    graph_step(args)
    run.step(i)
    sync()
    return (time.perf_counter() - start) * 1e3


def timed(make_run, args, label: str, warmup_s: float, also_back_to_back: bool) -> tuple[dict, object]:
    run = make_run()
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    bar = progress(args.steps, label)
    times = []
    # The clock, power and slowdowns over the timed steps (the same kernels run slower in a denser step);
    # under --parallel, each rank's own GPU.
    sampler = gpu_state.GpuSampler(gpu_state.device_id(torch.cuda.current_device()) if DEVICE == "cuda" else None)
    with sampler:
        for i in range(args.steps):
            times.append(step_ms(run, i, args))
            if bar is not None:
                bar.set_postfix(ms_per_step=f"{times[-1]:.1f}")
                bar.update()
            else:
                print(f"   {label}: step {i + 1}/{args.steps}: {times[-1]:.1f} ms", file=sys.stderr, flush=True)
    if bar is not None:
        bar.close()
    out = {"ms_per_step": round(statistics.mean(times), 3),
           "ms_per_step_median": round(statistics.median(times), 3), "warmup_s": round(warmup_s, 1)}
    if sampler.summary:
        out["gpu_state"] = sampler.summary
    if also_back_to_back:
        print(f"   {label}: {args.steps} steps back to back ...", file=sys.stderr, flush=True)
        pipelined = make_run()
        sync()
        start = time.perf_counter()
        for i in range(args.steps):
            graph_step(args)
            pipelined.step(i)
        sync()
        out["ms_per_step_back_to_back"] = round((time.perf_counter() - start) * 1e3 / args.steps, 3)
    return out, run


def time_steps(model, inputs, args, label: str) -> dict:
    """Warm up, time args.steps steps, profile one; the numbers and the final latents."""
    loop_cls = LOOPS[args.model]
    built = time.perf_counter()
    warm = loop_cls(model, inputs, args, max(args.steps, args.warmup_iterations, 2))

    def profile():
        graph_step(args)
        return profile_step(loop_cls(model, inputs, args, args.steps), 0)

    with torch.no_grad():
        if args.profile_into:
            warm_up(warm, args)
            args.profiles[label] = profile()
            return {}
        out, run = time_run(warm, lambda: loop_cls(model, inputs, args, args.steps), args, label, built,
                            also_back_to_back=True)
        out["latents"] = run.latents().clone()
        if profile_here(args):
            out["profile"] = profile()
    return out


def measure_depths(key: str, sources: dict, ours: Ours, backend: str, build, run, announce: bool = False):
    """Configuration ``key`` at N units (and 1 unit where scaled): ``build(source, fullgraph)`` makes
    its copy of a source model (None where ours cannot), ``run(built, label)`` times it; a fullgraph
    compile that fails is compiled again with graph breaks. Returns the row so far and the results by
    units, or None where it did not run (the row says why)."""
    name, kernels, compiled = e2e.ALL_CONFIGS[key]
    row = {"key": key, "config": name, "kernels": kernels, "compile": compiled}
    print(f"\n== {name}", flush=True)
    results, fullgraph = {}, True
    try:
        with attention_scope(backend):
            for units, source in sources.items():
                if compiled:
                    torch._dynamo.reset()
                built = build(source, fullgraph)
                if built is None:
                    row.update(status=ours.status, reason=ours.reason)
                    print(f"   ours: {ours.status} ({ours.reason})", flush=True)
                    return row, None
                label = config_label(name, units)
                if compiled and announce:
                    print(f"   {label}: compiling in the first warm-up step ...", flush=True)
                try:
                    results[units] = run(built, label)
                except Exception as e:  # a graph break under fullgraph: compile again, breaks allowed
                    if not (compiled and fullgraph):
                        raise
                    fullgraph = False
                    row["graph_break"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                    print(f"   fullgraph compile failed ({row['graph_break']}); compiling with graph breaks",
                          flush=True)
                    del built
                    torch._dynamo.reset()
                    built = build(source, fullgraph)
                    results[units] = run(built, label)
                del built
                memory_in_use()
    except Exception as e:  # never crash the run for one configuration (an out-of-memory one included)
        row.update(status="failed", reason=f"{type(e).__name__}: {str(e)[:300]}")
        print(f"   failed: {row['reason']}", flush=True)
        return row, None
    if compiled:
        row["fullgraph"] = fullgraph
    return row, results


def complete_row(row: dict, results: dict, args, fields, drop: str, note=lambda row: "") -> dict:
    """Fill a measured configuration's row: ms per step scaled to full depth where a 1-unit baseline
    ran, ``fields(scaled, measured)``'s entries, the scaled profile, the results at each depth less
    ``drop``; print its line (``note(row)`` after the ms per step). Returns the N-unit results."""
    n, full = args.layers, args.full_layers
    measured, baseline = results[n], results.get(1) if n != full else None

    def scaled(field):
        if measured[field] is None:
            return None
        return round(e2e.scale_to_depth(measured[field], baseline[field], n, full) if baseline else measured[field], 3)

    row["ms_per_step"] = scaled("ms_per_step")
    row.update(fields(scaled, measured))
    if "profile" in measured:
        row["profile"] = e2e.scale_profile(measured["profile"], baseline and baseline["profile"], n, full)
    row["measured"] = {"layers": n, **{k: v for k, v in measured.items() if k != drop}}
    if baseline:
        row["baseline"] = {"layers": 1, **{k: v for k, v in baseline.items() if k != drop}}
    print(f"   {row['ms_per_step']:.1f} ms/step{' (scaled to full depth)' if baseline else ''}{note(row)}"
          + (split_note(row["profile"]) if "profile" in row else "") + gpu_state.note(measured.get("gpu_state")),
          flush=True)
    return measured


def split_note(profile: dict) -> str:
    """A printed row's GPU split: "; GPU split GEMM G, attention A, other O ms, N launches" and the rest."""
    return (f"; GPU split GEMM {profile['gemm_ms']:.1f}, attention {profile['attention_ms']:.1f}, other "
            f"{profile['other_ms']:.1f} ms, {profile['launches']} launches{gaps_note(profile)}" + below_zero(profile))


def measure(key: str, sources: dict, ours: Ours, backend: str, inputs: dict, args, parallel: bool = False):
    """One configuration's row, and its N-unit latents (None where it did not run); ``parallel``: under
    context parallelism over every rank (row key ``<key>-cp``)."""
    row, results = measure_depths(key, sources, ours, backend,
                                  lambda source, fullgraph: prepare(key, source, ours, backend, args, fullgraph,
                                                                    parallel),
                                  lambda model, label: time_steps(model, inputs, args, label), announce=True)
    if parallel:
        row.update(key=f"{key}-cp", config=f"{row['config']}, {args.parallel} x{parallel_world()}")
    if results is None or args.profile_into:
        return row, None
    measured = complete_row(row, results, args, lambda scaled, measured: {
        "it_per_s": round(1e3 / row["ms_per_step"], 3), "warmup_s": measured["warmup_s"],
        "ms_per_step_back_to_back": scaled("ms_per_step_back_to_back")}, "latents",
        note=back_to_back)
    return row, measured["latents"]


# --- --train: one LoRA step ---------------------------------------------------------------------------

def step_kwargs(model, inputs, args) -> dict:
    """The transformer's keyword arguments at the step shape, as the loop's first step makes them,
    its passes as one batch (Wan: the two prompts' passes), so a training step sees the shape the
    table states ([2, tokens, hidden] for LTX-Video and Wan). Recorded from one no-grad step."""
    calls = []
    handle = model.register_forward_pre_hook(lambda module, a, kw: calls.append(kw), with_kwargs=True)
    try:
        with torch.no_grad():
            LOOPS[args.model](model, inputs, args, 2).predict(0)
    finally:
        handle.remove()
    return {k: torch.cat([c[k] for c in calls]) if isinstance(v, torch.Tensor) and len(calls) > 1 else v
            for k, v in calls[0].items()}


def fp32_kwargs(kwargs: dict) -> dict:
    return {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in kwargs.items()}


def add_lora(model, args, init: dict | None = None) -> dict:
    """Freeze ``model`` and add peft LoRA adapters of rank ``--lora-rank`` to its attention
    projections (LORA_TARGETS), both factors random (``init_lora_weights=False``: B = 0 would
    leave A without gradient), set to ``init`` (name -> tensor) where given. Returns the adapters'
    parameters by name."""
    from peft import LoraConfig, inject_adapter_in_model

    model.requires_grad_(False)
    config = LoraConfig(r=args.lora_rank, lora_alpha=args.lora_rank, target_modules=list(LORA_TARGETS),
                        init_lora_weights=False)
    torch.manual_seed(args.seed + 2)
    inject_adapter_in_model(config, model)
    params = {name: p for name, p in model.named_parameters() if ".lora_" in name}
    if not params:
        raise RuntimeError(f"no {', '.join(LORA_TARGETS)} projection to put LoRA adapters on")
    with torch.no_grad():
        for name, p in params.items():
            if init is not None:
                p.copy_(init[name])
            p.requires_grad_(True)
    return params


class TrainStep:
    """One LoRA training step: the transformer at the step shape, the MSE of each output against
    a fixed random target (seeded: the same for every configuration), backward into the adapters.
    ``step(i)`` runs it (the timing and profile_step call it); ``grads()`` flattens the adapters'
    gradients in name order."""

    def __init__(self, model, kwargs: dict, params: dict, seed: int):
        self.model, self.kwargs, self.params, self.seed = model, kwargs, params, seed
        self.targets = None
        self.loss = None

    def step(self, i: int = 0) -> None:
        for p in self.params.values():
            p.grad = None
        with torch.enable_grad():
            out = self.model(**self.kwargs)
            outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]
            if self.targets is None:
                g = torch.Generator().manual_seed(self.seed + 3)
                self.targets = [torch.randn(o.shape, generator=g).to(o.device) for o in outs]
            loss = sum(torch.nn.functional.mse_loss(o.float(), t) for o, t in zip(outs, self.targets))
            loss.backward()
        self.loss = loss.detach()

    def grads(self) -> torch.Tensor:
        return torch.cat([self.params[name].grad.double().flatten() for name in sorted(self.params)])


def prepare_train(key: str, source, ours: Ours, backend: str, args, init: dict, fullgraph: bool = True):
    """A fresh copy of ``source`` for ``key``: optimised (None where ours cannot), the adapters,
    the attention backend, gradient checkpointing, then compiled. Returns (model, adapters)."""
    _, kernels, compiled = e2e.CONFIGS[key]
    model = copy.deepcopy(source)
    if kernels and not ours.apply(model):
        return None, None
    params = add_lora(model, args, init)
    set_attention(model, backend)
    if args.grad_checkpointing == "on":
        model.enable_gradient_checkpointing()
    if compiled:
        compile_model(model, args, fullgraph)
    return model, params


def memory_in_use() -> int:
    """What the GPU holds once the garbage is collected (0 on the CPU)."""
    gc.collect()
    if DEVICE != "cuda":
        return 0
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated()


def time_train(step: TrainStep, args, label: str, start_bytes: int) -> dict:
    """Warm up, time args.steps training steps (forward + backward), profile one. The peak memory is
    torch.cuda.max_memory_allocated over the timed steps less what was allocated before the
    configuration's copy was made: its weights, adapters, activations and gradients."""
    if args.profile_into:
        warm_up(step, args)
        args.profiles[label] = profile_step(step, 0)
        return {}
    out, _ = time_run(step, lambda: step, args, label, time.perf_counter())
    peak = (torch.cuda.max_memory_allocated() - start_bytes) / 2 ** 30 if DEVICE == "cuda" else None
    out.update(peak_memory_gib=peak and round(peak, 3), loss=float(step.loss), grads=step.grads())
    if profile_here(args):
        out["profile"] = profile_step(step, 0)
    return out


def fp32_reference(source, kwargs: dict, args) -> tuple[dict, torch.Tensor]:
    """The adapters' initial weights (bf16, name -> tensor; every configuration starts from them)
    and the gradients of an fp32 stock step from them: ``source`` in float32 (its bf16 weights
    exactly), the inputs in float32, gradient checkpointing on (the same values, less memory)."""
    model = copy.deepcopy(source).float()
    params = add_lora(model, args)
    init = {name: p.detach().to(torch.bfloat16) for name, p in params.items()}
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(init[name])
    set_attention(model, "native")
    model.enable_gradient_checkpointing()
    step = TrainStep(model, fp32_kwargs(kwargs), params, args.seed)
    step.step()
    grads = step.grads()
    del model, step, params
    memory_in_use()
    return init, grads


def measure_train(key: str, sources: dict, ours: Ours, backend: str, kwargs: dict, init: dict,
                  reference: torch.Tensor, args) -> dict:
    """One configuration's row: ms per training step and peak memory (scaled to full depth where
    --layers asks), the relative L2 of its LoRA grads to the fp32 step's, the profiled split."""

    def build(source, fullgraph):
        start_bytes = memory_in_use()
        model, params = prepare_train(key, source, ours, backend, args, init, fullgraph)
        return None if model is None else (TrainStep(model, kwargs, params, args.seed), start_bytes)

    row, results = measure_depths(key, sources, ours, backend, build,
                                  lambda built, label: time_train(built[0], args, label, built[1]))
    if results is None or args.profile_into:
        return row

    def fields(scaled, measured) -> dict:
        return {"peak_memory_gib": scaled("peak_memory_gib"),
                "grad_rel_l2_vs_fp32": rel_l2(measured["grads"], reference), "loss": measured["loss"]}

    def note(row) -> str:
        memory = f", peak {row['peak_memory_gib']:.2f} GiB" if row["peak_memory_gib"] is not None else ""
        return f"{memory}, LoRA grads rel. L2 to fp32 {row['grad_rel_l2_vs_fp32']:.2e}"

    complete_row(row, results, args, fields, "grads", note)
    return row


def train_targets(rows: list) -> dict:
    """Issue 36's training targets: ours + compile faster than stock compile with peak memory no
    higher; each ours configuration's LoRA grads within TARGET_GRAD_AGREEMENT x the relative L2 to
    fp32 of its stock counterpart (eager against eager, compile against compile)."""
    by = e2e.measured_rows(rows)
    sc, oc = by.get("stock-compile"), by.get("ours-compile")
    out = {"ours_compile_faster_than_stock_compile": {
        "ours_compile_ms": oc and oc["ms_per_step"], "stock_compile_ms": sc and sc["ms_per_step"],
        "met": None if not (oc and sc) else oc["ms_per_step"] < sc["ms_per_step"]}}
    memory = [r and r["peak_memory_gib"] for r in (oc, sc)]
    out["ours_compile_peak_memory_within_stock_compile"] = {
        "ours_compile_gib": memory[0], "stock_compile_gib": memory[1],
        "met": None if None in memory else memory[0] <= memory[1]}
    for ours_key, stock_key in (("ours-eager", "stock-eager"), ("ours-compile", "stock-compile")):
        o, s = by.get(ours_key), by.get(stock_key)
        ratio = o["grad_rel_l2_vs_fp32"] / s["grad_rel_l2_vs_fp32"] if o and s and s["grad_rel_l2_vs_fp32"] else None
        out[f"{ours_key.replace('-', '_')}_grad_agreement"] = {
            "ours": o and o["grad_rel_l2_vs_fp32"], "stock": s and s["grad_rel_l2_vs_fp32"],
            "ratio": ratio and round(ratio, 4), "threshold": TARGET_GRAD_AGREEMENT,
            "met": None if not (o and s) else (o["grad_rel_l2_vs_fp32"]
                                               <= TARGET_GRAD_AGREEMENT * s["grad_rel_l2_vs_fp32"])}
    return out


def interleaved(sources: dict, ours: Ours, backend: str, kwargs: dict, init: dict, args) -> dict:
    """--interleave: stock compile and ours + compile built side by side at args.layers (not scaled),
    warmed up, then args.interleave rounds of args.steps synchronised steps each, the pair's order
    swapped every round. A host-bound step moves with the host's speed from process to process and
    minute to minute (docs/performance.md#training-step); taking turns puts that drift on
    both. Medians over all steps, and each round's ratio."""
    keys = ("stock-compile", "ours-compile")
    torch._dynamo.reset()
    steps = {}
    with attention_scope(backend):
        for key in keys:
            model, params = prepare_train(key, sources[args.layers], ours, backend, args, init)
            if model is None:
                return {"status": ours.status, "reason": ours.reason}
            steps[key] = TrainStep(model, kwargs, params, args.seed)
            for i in range(args.warmup_iterations):
                steps[key].step(i)
        sync()
        ms = {key: [] for key in keys}
        rounds = []
        bar = progress(args.interleave, "stock compile and ours + compile in turns")
        for r in range(args.interleave):
            order = keys if r % 2 == 0 else keys[::-1]
            for key in order:
                ms[key] += [step_ms(steps[key], i, args) for i in range(args.steps)]
            stock, mine = (statistics.median(ms[k][-args.steps:]) for k in keys)
            rounds.append({"order": list(order), "stock_compile_ms": round(stock, 3), "ours_compile_ms": round(mine, 3),
                           "speedup": round(stock / mine, 4)})
            if bar is not None:
                bar.set_postfix(speedup=f"{stock / mine:.3f}")
                bar.update()
        if bar is not None:
            bar.close()
    del steps
    memory_in_use()
    stock, mine = (statistics.median(ms[k]) for k in keys)
    return {"layers": args.layers, "rounds": rounds, "steps_per_round": args.steps,
            "stock_compile_ms_median": round(stock, 3), "ours_compile_ms_median": round(mine, 3),
            "speedup": round(stock / mine, 4), "ours_faster": mine < stock}


def lora_setup(args, sources: dict, inputs: dict) -> tuple[dict, dict, torch.Tensor]:
    """--train: the step's keyword arguments, the adapters' initial weights and the fp32 stock grads."""
    kwargs = step_kwargs(sources[min(sources)], inputs, args)
    print(f"\n== LoRA training step: rank {args.lora_rank} on {', '.join(LORA_TARGETS)}, gradient checkpointing "
          f"{args.grad_checkpointing}; the fp32 stock reference ...", flush=True)
    return (kwargs, *fp32_reference(sources[args.layers], kwargs, args))


def train(args, env: dict, sources: dict, inputs: dict, shape: dict, depth: dict, attention: dict) -> None:
    """--train: every configuration's LoRA step; the JSON and chart beside the inference ones."""
    spec = args.spec
    kwargs, init, reference = lora_setup(args, sources, inputs)
    ours = Ours(args)
    rows = [measure_train(key, sources, ours, attention["chosen"], kwargs, init, reference, args)
            for key in args.configs]
    if "ms_per_step" not in rows[0]:
        sys.exit(f"stock eager failed: {rows[0].get('reason')}")
    attach_profiles(rows, args, attention["chosen"])
    for row in rows:
        if "ms_per_step" in row:
            row["speedup"] = round(rows[0]["ms_per_step"] / row["ms_per_step"], 3)
            row["it_per_s"] = round(1e3 / row["ms_per_step"], 3)
    turns = None
    if args.interleave:
        try:
            turns = interleaved(sources, ours, attention["chosen"], kwargs, init, args)
        except Exception as e:  # keep the table measured above (an out-of-memory pair included)
            turns = {"status": "failed", "reason": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"   in turns: failed ({turns['reason']})", flush=True)
    hidden = kwargs["hidden_states"]
    payload = {
        "env": env,
        "model": {"key": args.model, "title": spec.title, "class": spec.cls, "pipeline": spec.pipeline,
                  "variant": args.config, "kwargs": args.variant.kwargs, "note": args.variant.note,
                  "weights": str(args.weights) if args.weights else "random", "notes": list(spec.notes)},
        "shape": {**shape, "train_batch": hidden.shape[0]}, "depth": depth, "attention": attention,
        "ours": ours.record(),
        "train": {"lora_rank": args.lora_rank, "lora_targets": list(LORA_TARGETS),
                  "lora_parameters": sum(t.numel() for t in init.values()),
                  "grad_checkpointing": args.grad_checkpointing, "loss": "MSE of each output against a seeded "
                  "random target", "reference": "fp32 stock step, same weights (bf16 values), inputs and adapters"},
        "options": {"steps": args.steps, "warmup_iterations": args.warmup_iterations, "interleave": args.interleave,
                    "compile_scope": args.compile_scope, "compile_mode": args.compile_mode, "seed": args.seed,
                    "configs": args.configs, "profiled": profiled(args), **setup_options(args)},
        "rows": rows, "targets": train_targets(rows), **({"interleaved": turns} if turns else {}),
        "timing": "wall time per training step (forward at the step shape, loss, backward into the adapters; no "
                  "optimizer step), synchronised after each; mean over the timed steps; scaled to full depth where "
                  "depth.scaled. Peak memory: max_memory_allocated over the timed steps less what was allocated "
                  "before the configuration's model copy",
        "profile": PROFILE_NOTE, "split": e2e.SPLIT_VERSION,
    }
    name = (e2e.result_name(args.model, args.config) + "-train" + ("-ckpt" if args.grad_checkpointing == "on" else "")
            + setup_suffix(args))
    path = write_json(name, payload, args.out)
    chart = e2e.write_chart(payload, path.with_name(path.name[:-len(".json")]))
    print("\n" + train_table(payload) + "\n")
    print(f"wrote {path} and {chart}")


# --- the run ------------------------------------------------------------------------------------------

def environment(args) -> dict:
    import diffusers

    if DEVICE == "cuda":
        env = gpu_environment(args.commit, args.dev_build)
    else:
        env = {"device": "cpu", "torch": torch.__version__, "python": platform.python_version(),
               "commit": args.commit or git_commit(),
               "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    env["diffusers"] = diffusers.__version__
    return env


def shape_record(args, base) -> dict:
    spec, step = args.spec, args.step
    record = {"frames": step.frames, "height": step.height, "width": step.width, "videos": step.videos,
              "passes": e2e.passes(spec, step.videos), "latent": list(e2e.latent_grid(spec, step)),
              "tokens": e2e.tokens(spec, step), "text_tokens": step.text_tokens,
              "text_valid": step.text_valid or step.text_tokens, "dtype": "bfloat16", "guidance": spec.guidance}
    if spec.audio:
        record["audio_tokens"] = e2e.audio_tokens(spec, step)
    if getattr(base.config, "image_dim", None):
        record["image_tokens"] = 257
    return record


def depth_record(args) -> dict:
    n, full = args.layers, args.full_layers
    return {"scaled": n != full, "layers": n, "full_layers": full, "unit": args.spec.unit,
            "baseline_layers": 1 if n != full else None, "method": e2e.DEPTH_METHOD if n != full else None}


def redraw(args) -> None:
    data = json.loads(args.chart_from.read_text())
    stem = (args.out or args.chart_from.parent) / args.chart_from.stem
    print(train_table(data) if "train" in data else model_block(data))
    print(f"wrote {e2e.write_chart(data, stem)}")


def resplit(path: Path) -> None:
    """Rewrite ``path`` (a one-GPU inference result) with each profile split by :func:`kernel_category`
    as it is now, for results measured before a fix to it. A configuration whose profiles lack
    per-kernel times keeps its split, and is named."""
    data = json.loads(path.read_text())
    if "train" in data or "parallel" in data or "fp8" in data:
        sys.exit(f"--resplit: {path} is a training, parallel or FP8 result; only the four inference "
                 "configurations' results are re-split")
    depth, kept = data["depth"], []
    for row in data["rows"]:
        profiles = [row[part]["profile"] for part in ("measured", "baseline") if "profile" in row.get(part, {})]
        if not profiles or not all("kernel_ms" in p for p in profiles):
            kept.append(row["config"])
            continue
        for profile in profiles:
            split = dict.fromkeys(e2e.CATEGORIES, 0.0)
            for name, ms in profile["kernel_ms"].items():
                split[kernel_category(name)] += ms
            profile.update(category_fields(split))
            for top in profile.get("top_kernels", []):
                top["category"] = kernel_category(top["name"])
        baseline = row.get("baseline", {}).get("profile")
        row["profile"] = e2e.scale_profile(row["measured"]["profile"], baseline, depth["layers"],
                                           depth["full_layers"])
    data["targets"], data["profile"] = e2e.targets(data["rows"]), PROFILE_NOTE
    if not kept:
        data["split"] = e2e.SPLIT_VERSION
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(model_block(data))
    print(f"rewrote {path} and {e2e.write_chart(data, path.with_suffix(''))}"
          + (f"; no per-kernel times, split kept: {', '.join(kept)}" if kept else ""))


def main(argv=None) -> None:
    global DEVICE
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.profiles = {} if args.profile_into else None  # the profile pass's child fills it
    args.profile_failed = None  # profile_pass's exit status where it failed
    if args.chart_from:
        redraw(args)
        return
    if args.resplit:
        resplit(args.resplit)
        return
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("generate_video.py needs a CUDA GPU (or --device cpu --config tiny to try it)")
    rank = start_parallel() if args.parallel else 0
    spec, step = args.spec, args.step
    env = environment(args)
    print(f"{env['device']}  torch {env['torch']}  diffusers {env['diffusers']}  commit {env['commit'][:12]}",
          flush=True)
    base = build(args)
    sources = {args.layers: base}
    if args.layers != args.full_layers:
        sources[1] = truncate(copy.deepcopy(base), spec, 1)
    inputs = LOOPS[args.model].make_inputs(base, args)
    shape = shape_record(args, base)
    depth = depth_record(args)
    print(f"{spec.title} ({args.config}, {spec.cls}): {shape['tokens']} tokens"
          + (f" + {shape['audio_tokens']} audio" if "audio_tokens" in shape else "")
          + f", {step.text_tokens} text tokens, transformer passes {shape['passes']}, {args.steps} steps; "
          + (f"{args.layers} of {depth['full_layers']} layers, scaled to full depth ({e2e.DEPTH_METHOD}, "
             f"1-layer baseline)" if depth["scaled"] else f"full depth, {depth['full_layers']} layers"), flush=True)

    if args.profile_into:
        run_profile_pass(args, sources, inputs)
        return
    if args.parallel:  # ring attention needs a backend that returns the LSE: diffusers' cuDNN one
        chosen = "cudnn" if args.parallel == "ring" else (
            "native" if args.attention_backend == "auto" else args.attention_backend)
        attention = {"requested": args.attention_backend, "chosen": chosen, "why": f"--parallel {args.parallel}",
                     "tolerance": float(args.attention_tolerance), "measured_on": "not measured", "backends": []}
    elif args.train and args.attention_backend != "auto":  # a training run measures no inference backends
        attention = {"requested": args.attention_backend, "chosen": args.attention_backend, "why": "requested",
                     "tolerance": float(args.attention_tolerance), "backends": []}
    else:
        print(f"\n== attention backends (stock eager{', the LoRA step' if args.train else ''})", flush=True)
        attention = probe_attention(base, inputs, args)
    if args.train:
        train(args, env, sources, inputs, shape, depth, attention)
        return
    ours = Ours(args)
    rows, stock_latents = [], None
    for key in args.configs:
        row, latents = measure(key, sources, ours, attention["chosen"], inputs, args)
        if key == "stock-eager":
            if latents is None:
                sys.exit(f"stock eager failed: {row.get('reason')}")
            stock_latents = latents
        if latents is not None:
            row["rel_l2_vs_stock"] = rel_l2(latents, stock_latents)
        rows.append(row)
        if args.parallel:
            row, latents = measure(key, sources, ours, attention["chosen"], inputs, args, parallel=True)
            if latents is not None:
                row["rel_l2_vs_stock"] = rel_l2(latents, stock_latents)
            rows.append(row)
    attach_profiles(rows, args, attention["chosen"])
    stock_ms = rows[0]["ms_per_step"]
    for row in rows:
        if "ms_per_step" in row:
            row["speedup"] = round(stock_ms / row["ms_per_step"], 3)
    parallel = parallel_record(rows, args) if args.parallel else None
    fp8 = None
    if args.fp8:
        print("\n== FP8 quality (first step, against fp32)", flush=True)
        fp8 = fp8_quality(base, inputs, ours, args)
        fp8["targets"] = e2e.fp8_targets(rows, args.model)

    payload = {
        "env": env,
        "model": {"key": args.model, "title": spec.title, "class": spec.cls, "pipeline": spec.pipeline,
                  "variant": args.config, "kwargs": args.variant.kwargs, "note": args.variant.note,
                  "weights": str(args.weights) if args.weights else "random", "notes": list(spec.notes)},
        "shape": shape, "depth": depth, "attention": attention, "ours": ours.record(),
        "options": {"steps": args.steps, "warmup_iterations": args.warmup_iterations,
                    "guidance_scale": float(args.guidance_scale), "compile_scope": args.compile_scope,
                    "compile_mode": args.compile_mode, "seed": args.seed, "configs": args.configs,
                    "profiled": profiled(args), **setup_options(args)},
        "rows": rows, "targets": e2e.targets(rows), **({"fp8": fp8} if fp8 else {}),
        **({"parallel": parallel} if parallel else {}),
        "timing": "wall time per denoising step (every transformer pass, guidance, scheduler step), synchronised "
                  "after each step; mean over the timed steps; scaled to full depth where depth.scaled; "
                  "ms_per_step_back_to_back: as many steps with one synchronisation at the end",
        "profile": PROFILE_NOTE, "split": e2e.SPLIT_VERSION,
    }
    problems = e2e.schema_problems(payload)
    if problems:  # the render and the tests read this schema
        print("schema problems: " + "; ".join(problems), file=sys.stderr)
    if rank != 0:
        return
    suffix = "-fp8" if args.fp8 else (f"-cp{parallel_world()}-{args.parallel}" if args.parallel else "")
    suffix += setup_suffix(args)
    path = write_json(e2e.result_name(args.model, args.config) + suffix, payload, args.out)
    chart = e2e.write_chart(payload, path.with_name(path.name[:-len(".json")]))
    print("\n" + (fp8_block(payload) if args.fp8 else model_block(payload)) + "\n")
    print(f"wrote {path} and {chart}")


if __name__ == "__main__":
    main()
