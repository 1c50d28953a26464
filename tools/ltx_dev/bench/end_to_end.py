"""The end-to-end benchmark's data and arithmetic (benchmarks/generate_video.py runs it): each
model's configurations and step shape, how pixels become tokens, the per-layer scaling to full
depth, the targets of issue 35, the result file's schema and its chart. No torch here:
`ltx-dev render` and the CPU tests use it too.

Depth scaling (`--layers N` of a model with L layers): every configuration is measured on the
N-layer model and on the 1-layer model, in the same process and compile cache, and

    t_full = t_1 + (L - 1) * (t_N - t_1) / (N - 1)

for the step time and for each profiler category. The 1-layer model holds all the per-step work
that is not a repeated block (embeddings, RoPE tables, output head, guidance, scheduler) exactly
once, plus one block; the difference of the two is N - 1 blocks measured under the same
optimisation, attention backend and compilation. It also keeps models whose blocks are not all
alike exact: Mochi's last block (``context_pre_only``) is in both models, so the difference is
regular blocks only. A 0-layer baseline would need ``optimize`` to accept a model without blocks
and leaves such a last block out; t_N * L / N would count the per-step work L / N times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# The four configurations, in the order they run (stock eager first: every speedup is against it).
CONFIGS = {"stock-eager": ("stock eager", False, False), "ours-eager": ("ours eager", True, False),
           "stock-compile": ("stock compile", False, True), "ours-compile": ("ours + compile", True, True)}
# With --fp8 (issue 37), after those: the transformer blocks' linears as float8_e4m3 GEMMs with rowwise
# scales. Ours: optimize(..., fp8=True); torchao: its float8 dynamic-activation / float8-weight rowwise
# config on the same linears (ours' kernels off), compiled.
FP8_CONFIGS = {"ours-fp8-eager": ("ours fp8 eager", True, False),
               "ours-fp8-compile": ("ours fp8 + compile", True, True),
               "torchao-fp8-compile": ("torchao fp8 + compile", False, True)}
ALL_CONFIGS = {**CONFIGS, **FP8_CONFIGS}
# Issue 37's targets: the LTX-Video 2B step (ms), the speedup of ours fp8 + compile over ours + compile
# (Wan, LTX-2), and the quality bar (relative L2 to fp32 against stock bf16's).
TARGET_FP8_LTX_MS = 30.0
TARGET_FP8_SPEEDUP = 1.3
TARGET_FP8_QUALITY_RATIO = 3.0
ATTENTION_BACKENDS = ("native", "cudnn", "flash", "efficient")  # "native": diffusers' default (PyTorch picks)
ATTENTION_TOLERANCE = 0.02  # relative L2 of the first step's transformer output against the native backend's
CATEGORIES = ("gemm", "attention", "other")
# How profiles split kernels into CATEGORIES: 2 counts Inductor's pointwise and reduction kernels as other
# whatever their names list (1, until 2026-11-28: those named after the SDPA they feed counted as attention).
SPLIT_VERSION = 2
DEPTH_METHOD = "t_full = t_1 + (L - 1) * (t_N - t_1) / (N - 1), per step time and per profiler category"
# Issue 35's targets, for every model.
TARGET_SPEEDUP_OVER_STOCK_COMPILE = 1.1
TARGET_OTHER_FRACTION = 0.25
OURS_NOT_SUPPORTED = "not supported yet"


@dataclass(frozen=True)
class Geometry:
    """How a step's pixels become tokens: the VAE's compression and the transformer's patches.
    ``vae_temporal`` None: an image model."""

    vae_temporal: int | None
    vae_spatial: int
    patch_temporal: int = 1
    patch_spatial: int = 1


@dataclass(frozen=True)
class Step:
    """The shape of one denoising step: ``videos`` per prompt (the pipeline's guidance decides how
    many sequences the transformer sees), ``text_valid`` prompt tokens of ``text_tokens`` (None:
    all), ``frames`` None for an image model."""

    frames: int | None
    height: int
    width: int
    text_tokens: int
    videos: int = 1
    text_valid: int | None = None


@dataclass(frozen=True)
class Variant:
    """A configuration of the model class: constructor arguments over the class defaults (the
    depth arguments are set from ``units``), its depth in units, and a step shape of its own
    where the model's default does not fit (the tiny variants, for the CPU)."""

    kwargs: dict
    units: int
    step: Step | None = None
    note: str = ""


@dataclass(frozen=True)
class Audio:
    """LTX-2's audio stream: latents per second = sampling rate / hop / the audio VAE's temporal
    compression, over the video's duration at ``fps``."""

    fps: float = 24.0
    sampling_rate: int = 16000
    hop_length: int = 160
    vae_temporal: int = 4

    def tokens(self, frames: int) -> int:
        return round(frames / self.fps * self.sampling_rate / self.hop_length / self.vae_temporal)


@dataclass(frozen=True)
class Model:
    """One model of the benchmark. ``depth``: (constructor argument, block list attribute, blocks
    per unit); a unit is what --layers counts. ``guidance``: how the pipeline runs classifier-free
    guidance: "batched" (one pass over [negative, positive]), "separate" (two passes) or "embedded"
    (guidance-distilled, one pass, the scale is an input)."""

    key: str
    title: str
    cls: str
    pipeline: str
    geometry: Geometry
    step: Step
    variants: dict
    default: str
    depth: tuple
    blocks: tuple          # block classes compiled one by one (regional compilation)
    guidance: str
    guidance_scale: float
    unit: str
    audio: Audio | None = None
    last_block_differs: bool = False  # the last block is another kind (kept when --weights are cut)
    notes: tuple = field(default=())

    def variant(self, name: str | None) -> Variant:
        return self.variants[name or self.default]


TINY_STEP_VIDEO = dict(height=64, width=64, text_tokens=8)
TINY = "a tiny configuration, to try the script on the CPU"
TINY_LTX2 = {"in_channels": 8, "out_channels": 8, "num_attention_heads": 2, "attention_head_dim": 8,
             "cross_attention_dim": 16, "audio_in_channels": 8, "audio_out_channels": 8,
             "audio_num_attention_heads": 2, "audio_attention_head_dim": 4, "audio_cross_attention_dim": 8,
             "caption_channels": 32}
# LTX-2.3's transformer options over LTX-2.0's: a per-head gate on every attention output and the
# text cross-attention's query modulated by the timestep (its keys and values by the sigma), in both streams
LTX2_3 = {"gated_attn": True, "audio_gated_attn": True, "cross_attn_mod": True, "audio_cross_attn_mod": True}

# Where the numbers come from, per model: the diffusers 0.42.1 class defaults, or the published
# transformer/config.json of the checkpoint named; step shapes are issue 35's table.
MODELS = {
    # LTX-Video 0.9: LTXVideoTransformer3DModel's defaults are the 2B config (Lightricks/LTX-Video:
    # 28 layers, 32 heads x 64, T5-XXL 4096). Step: the README's run, 49 frames at 768x512,
    # 128 prompt tokens of which 40 valid. VAE 8x temporal, 32x spatial; patch 1.
    "ltx": Model(
        key="ltx", title="LTX-Video 0.9", cls="LTXVideoTransformer3DModel", pipeline="LTXPipeline",
        geometry=Geometry(8, 32), step=Step(frames=49, height=512, width=768, text_tokens=128, text_valid=40),
        variants={"2b": Variant({}, 28),
                  "tiny": Variant({"in_channels": 8, "out_channels": 8, "num_attention_heads": 2,
                                   "attention_head_dim": 8, "cross_attention_dim": 16, "caption_channels": 32}, 3,
                                  Step(frames=9, **TINY_STEP_VIDEO, text_valid=4), TINY)},
        default="2b", depth=(("num_layers", "transformer_blocks", 1),), blocks=("LTXVideoTransformerBlock",),
        guidance="batched", guidance_scale=3.0, unit="LTXVideoTransformerBlock"),
    # LTX-2: LTX2VideoTransformer3DModel's defaults are LTX-2.0 (48 layers; video 32 heads x 128,
    # audio 32 heads x 64; connector outputs of 3840 channels). Step: 121 frames at 768x512 (VAE 8x
    # temporal, 32x spatial: 6144 tokens) and 121 / 24 fps * 16000 / 160 / 4 = 126 audio tokens
    # (LTX2Pipeline's defaults), 1024 prompt tokens, all valid after the text connectors.
    "ltx2": Model(
        key="ltx2", title="LTX-2", cls="LTX2VideoTransformer3DModel", pipeline="LTX2Pipeline",
        geometry=Geometry(8, 32), step=Step(frames=121, height=512, width=768, text_tokens=1024),
        variants={"2.0": Variant({}, 48),
                  "2.3": Variant(LTX2_3, 48, note="LTX-2.0's dims with LTX-2.3's gated attention and "
                                                  "cross-attention modulation"),
                  "tiny": Variant(TINY_LTX2, 3, Step(frames=9, **TINY_STEP_VIDEO), TINY),
                  "tiny-2.3": Variant({**TINY_LTX2, **LTX2_3}, 3, Step(frames=9, **TINY_STEP_VIDEO),
                                      TINY + ", with LTX-2.3's options")},
        default="2.0", depth=(("num_layers", "transformer_blocks", 1),), blocks=("LTX2VideoTransformerBlock",),
        guidance="batched", guidance_scale=3.0, unit="LTX2VideoTransformerBlock", audio=Audio(),
        notes=("classifier-free guidance only (x0-space delta, guidance rescale 0.7, audio scale 7): "
               "LTX2Pipeline's default spatio-temporal and modality-isolation guidance passes (two more "
               "batch-1 passes per step) are left out",)),
    # Wan 2.1: WanTransformer3DModel's defaults are the 14B config (Wan-AI/Wan2.1-T2V-14B-Diffusers:
    # 40 layers, 40 heads x 128, FFN 13824); 1.3B is Wan-AI/Wan2.1-T2V-1.3B-Diffusers (30 layers,
    # 12 heads, FFN 8960); image-to-video adds the CLIP image stream (Wan-AI/Wan2.1-I2V-14B-480P-
    # Diffusers: image_dim 1280, added_kv_proj_dim = hidden size, in_channels 16 + 4 mask + 16
    # condition). Step: 81 frames at 832x480 (VAE 4x temporal, 8x spatial, patch 1x2x2: 32,760
    # tokens), 512 prompt tokens (T5, zero-padded, all attended).
    "wan": Model(
        key="wan", title="Wan 2.1", cls="WanTransformer3DModel", pipeline="WanPipeline",
        geometry=Geometry(4, 8, 1, 2), step=Step(frames=81, height=480, width=832, text_tokens=512),
        variants={"1.3b": Variant({"num_attention_heads": 12, "ffn_dim": 8960}, 30),
                  "14b": Variant({}, 40),
                  "1.3b-i2v": Variant({"num_attention_heads": 12, "ffn_dim": 8960, "in_channels": 36,
                                       "image_dim": 1280, "added_kv_proj_dim": 1536}, 30,
                                      note="the 1.3B dims with the image-to-video inputs (no such checkpoint)"),
                  "14b-i2v": Variant({"in_channels": 36, "image_dim": 1280, "added_kv_proj_dim": 5120}, 40),
                  "tiny": Variant({"num_attention_heads": 2, "attention_head_dim": 8, "ffn_dim": 32, "text_dim": 32,
                                   "freq_dim": 16, "in_channels": 4, "out_channels": 4}, 3,
                                  Step(frames=5, height=32, width=32, text_tokens=8), TINY)},
        default="1.3b", depth=(("num_layers", "blocks", 1),), blocks=("WanTransformerBlock",),
        guidance="separate", guidance_scale=5.0, unit="WanTransformerBlock"),
    # Mochi 1: MochiTransformer3DModel's defaults are genmo/mochi-1-preview's 10B (48 layers,
    # 24 heads x 128). Step: 85 frames at 848x480 (VAE 6x temporal, 8x spatial, patch 2: 23,850
    # tokens), 256 prompt tokens, all valid.
    "mochi": Model(
        key="mochi", title="Mochi 1", cls="MochiTransformer3DModel", pipeline="MochiPipeline",
        geometry=Geometry(6, 8, 1, 2), step=Step(frames=85, height=480, width=848, text_tokens=256),
        variants={"10b": Variant({}, 48),
                  "tiny": Variant({"num_attention_heads": 2, "attention_head_dim": 8, "pooled_projection_dim": 16,
                                   "in_channels": 4, "text_embed_dim": 32, "time_embed_dim": 16,
                                   "max_sequence_length": 8}, 3,
                                  Step(frames=7, height=32, width=32, text_tokens=8), TINY)},
        default="10b", depth=(("num_layers", "transformer_blocks", 1),), blocks=("MochiTransformerBlock",),
        guidance="batched", guidance_scale=4.5, unit="MochiTransformerBlock", last_block_differs=True),
    # Flux: FluxTransformer2DModel's defaults with guidance_embeds=True are black-forest-labs/FLUX.1-dev
    # (19 double-stream + 38 single-stream blocks, 24 heads x 128). Step: 1024x1024 (VAE 8x, 2x2
    # packing: 4096 tokens), 512 prompt tokens; guidance-distilled (no negative pass).
    "flux": Model(
        key="flux", title="Flux.1", cls="FluxTransformer2DModel", pipeline="FluxPipeline",
        geometry=Geometry(None, 8, 1, 2), step=Step(frames=None, height=1024, width=1024, text_tokens=512),
        variants={"dev": Variant({"guidance_embeds": True}, 19),
                  "tiny": Variant({"in_channels": 16, "attention_head_dim": 16, "num_attention_heads": 2,
                                   "joint_attention_dim": 32, "pooled_projection_dim": 8, "guidance_embeds": True,
                                   "axes_dims_rope": (4, 6, 6)}, 3,
                                  Step(frames=None, **TINY_STEP_VIDEO), TINY)},
        default="dev", depth=(("num_layers", "transformer_blocks", 1),
                              ("num_single_layers", "single_transformer_blocks", 2)),
        blocks=("FluxTransformerBlock", "FluxSingleTransformerBlock"), guidance="embedded", guidance_scale=3.5,
        unit="1 FluxTransformerBlock + 2 FluxSingleTransformerBlock"),
}


# --- shapes -------------------------------------------------------------------------------------

def latent_grid(model: Model, step: Step) -> tuple[int, int, int]:
    """(frames, height, width) of the latent, before the transformer's patches (frames 1 for an image)."""
    g = model.geometry
    frames = 1 if g.vae_temporal is None else (step.frames - 1) // g.vae_temporal + 1
    return frames, step.height // g.vae_spatial, step.width // g.vae_spatial


def tokens(model: Model, step: Step) -> int:
    """The transformer's (video or image) sequence length."""
    frames, height, width = latent_grid(model, step)
    g = model.geometry
    return (frames // g.patch_temporal) * (height // g.patch_spatial) * (width // g.patch_spatial)


def audio_tokens(model: Model, step: Step) -> int | None:
    return model.audio.tokens(step.frames) if model.audio else None


def shape_problems(model: Model, step: Step) -> list[str]:
    """Why the VAE and the patches cannot take `step` (empty: they can)."""
    g, problems = model.geometry, []
    if g.vae_temporal is None:
        if step.frames is not None:
            problems.append(f"{model.title} makes images: no frame count")
    elif step.frames is None or (step.frames - 1) % g.vae_temporal or step.frames < 1:
        problems.append(f"frames must be {g.vae_temporal}k+1 ({model.title}'s VAE)")
    elif latent_grid(model, step)[0] % g.patch_temporal:
        problems.append(f"latent frames must be a multiple of {g.patch_temporal}")
    for name, size in (("height", step.height), ("width", step.width)):
        if size % (g.vae_spatial * g.patch_spatial) or size <= 0:
            problems.append(f"{name} must be a multiple of {g.vae_spatial * g.patch_spatial}")
    if step.text_valid is not None and not 0 < step.text_valid <= step.text_tokens:
        problems.append("valid text tokens must be 1..text tokens")
    return problems


def passes(model: Model, videos: int) -> list[int]:
    """The transformer batch of each pass of one step, as the pipeline runs guidance."""
    return {"batched": [2 * videos], "separate": [videos, videos], "embedded": [videos]}[model.guidance]


def depth_kwargs(model: Model, units: int) -> dict:
    """The constructor arguments that build `units` units."""
    return {arg: units * per_unit for arg, _, per_unit in model.depth}


# --- depth scaling ------------------------------------------------------------------------------

def scale_to_depth(t_n: float, t_1: float, n: int, full: int) -> float:
    """The full-depth value from the N-unit and the 1-unit measurements (DEPTH_METHOD)."""
    if n == full:
        return t_n
    if n < 2 or n > full:
        raise ValueError(f"scaling needs 2 <= N < L, got N={n}, L={full}")
    return t_1 + (full - 1) * (t_n - t_1) / (n - 1)


# A profiled step's device time in collectives (NCCL kernels) and the part of it no compute kernel overlaps.
COLLECTIVE_KEYS = ("collective_ms", "exposed_collective_ms")
# A profiled step's device timeline: from its first operation's start to its last one's end, and the time
# inside that span when none runs (the GPU waiting for the host's launches, or for gaps between kernels).
TIMELINE_KEYS = ("gpu_span_ms", "gpu_gaps_ms")


def union(spans) -> list[list[float]]:
    """(start, end) spans merged where they overlap or touch, sorted."""
    merged = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def collective_split(kernels: list[tuple[float, float, bool]]) -> dict:
    """From one step's device operations as (start µs, end µs, is a collective): the time some
    collective runs and the part of it when no other kernel does ("exposed": the step waits on the
    exchange or on a peer), in ms. Empty when no collective ran."""
    collective = union([(s, e) for s, e, c in kernels if c])
    if not collective:
        return {}
    compute = union([(s, e) for s, e, c in kernels if not c])
    busy = sum(e - s for s, e in collective)
    overlapped, i = 0.0, 0
    for start, end in collective:  # both lists sorted and disjoint: one sweep
        while i < len(compute) and compute[i][1] <= start:
            i += 1
        j = i
        while j < len(compute) and compute[j][0] < end:
            overlapped += min(end, compute[j][1]) - max(start, compute[j][0])
            j += 1
    return {"collective_ms": round(busy / 1e3, 3), "exposed_collective_ms": round((busy - overlapped) / 1e3, 3)}


def timeline_split(kernels: list[tuple[float, float, bool]]) -> dict:
    """From one step's device operations as (start µs, end µs, ...): ``gpu_span_ms``, first start to last
    end, and ``gpu_gaps_ms``, the part of it when no operation runs (ms). Empty without operations. A
    step's wall time less its span is the host's time before the first launch and after the last."""
    merged = union([(s, e) for s, e, *_ in kernels])
    if not merged:
        return {}
    span = merged[-1][1] - merged[0][0]
    return {"gpu_span_ms": round(span / 1e3, 3), "gpu_gaps_ms": round((span - sum(e - s for s, e in merged)) / 1e3, 3)}


def scale_profile(measured: dict, baseline: dict | None, n: int, full: int) -> dict:
    """A profiled step's categories (ms), device launches and collective times scaled to full depth;
    floor and total recomputed; with a baseline, what one more layer adds by kernel name (launches
    and ms). A figure the N-unit step measured so far below the 1-unit one that it scales below zero
    (host or collective waits that vary more than a layer adds) is kept as computed: ``below_zero``
    names it."""
    out = {}
    collectives = [k for k in COLLECTIVE_KEYS + TIMELINE_KEYS if k in measured and (baseline is None or k in baseline)]
    for key in [f"{cat}_ms" for cat in CATEGORIES] + (["launches"] if "launches" in measured else []) + collectives:
        out[key] = round(measured[key] if baseline is None else scale_to_depth(measured[key], baseline[key], n, full), 3)
    if "launches" in out:
        out["launches"] = round(out["launches"])
    out["floor_ms"] = round(out["gemm_ms"] + out["attention_ms"], 3)
    out["kernels_ms"] = round(out["floor_ms"] + out["other_ms"], 3)
    for by_name, per_layer, digits in (("launch_counts", "launches_per_unit", 2), ("kernel_ms", "ms_per_unit", 3)):
        if baseline is not None and by_name in measured and by_name in baseline:
            out[per_layer] = per_unit(measured[by_name], baseline[by_name], n, digits)
    return out


def below_zero(profile: dict) -> list[str]:
    """A scaled profile's figures (ms, launches) below zero: noise, not time (the N-unit step measured less
    than the 1-unit one); more units measure them."""
    return [k for k, v in profile.items() if isinstance(v, (int, float)) and v < 0]


def per_unit(measured: dict, baseline: dict, n: int, digits: int = 2) -> dict:
    """{kernel name: what one more unit (layer) adds}, from a by-name count or time at ``n`` units and
    at 1, most first (a name whose figure does not change with depth is per-step work, left out)."""
    added = {name: (measured.get(name, 0) - baseline.get(name, 0)) / (n - 1)
             for name in measured.keys() | baseline.keys()}
    return {name: round(v, digits) for name, v in sorted(added.items(), key=lambda kv: -kv[1]) if round(v, digits)}


# --- targets ------------------------------------------------------------------------------------

def measured_rows(rows: list[dict]) -> dict:
    """{config key: row} of the rows that were measured (not refused)."""
    return {r["key"]: r for r in rows if "ms_per_step" in r}


def targets(rows: list[dict]) -> dict:
    """Issue 35's targets from a run's rows (full-depth values): each with its numbers and `met`
    (None where a configuration is missing), judged on steps synchronised one by one. "Ours'
    other" is ours + compile's (ours eager's is given beside it); ours eager and stock compile
    back to back are given beside theirs."""
    by = measured_rows(rows)
    sc, oe, oc = by.get("stock-compile"), by.get("ours-eager"), by.get("ours-compile")
    out = {}
    out["ours_eager_faster_than_stock_compile"] = {
        "ours_eager_ms": oe and oe["ms_per_step"], "stock_compile_ms": sc and sc["ms_per_step"],
        "met": None if not (oe and sc) else oe["ms_per_step"] < sc["ms_per_step"]}
    back = [row and row.get("ms_per_step_back_to_back") for row in (oe, sc)]
    if all(back):  # as the pipelines run their steps (no host sync between them): beside the verdict
        out["ours_eager_faster_than_stock_compile"]["back_to_back_ms"] = back
    speedup = sc["ms_per_step"] / oc["ms_per_step"] if sc and oc else None
    out["ours_compile_speedup_over_stock_compile"] = {
        "value": speedup and round(speedup, 3), "threshold": TARGET_SPEEDUP_OVER_STOCK_COMPILE,
        "met": None if speedup is None else speedup >= TARGET_SPEEDUP_OVER_STOCK_COMPILE}

    def other(row):
        return row["profile"]["other_ms"] if row and row.get("profile") else None

    fraction = other(oc) / other(sc) if other(oc) is not None and other(sc) else None
    eager_fraction = other(oe) / other(sc) if other(oe) is not None and other(sc) else None
    out["ours_other_within_fraction_of_stock_compile_other"] = {
        "value": fraction and round(fraction, 3), "ours_eager_value": eager_fraction and round(eager_fraction, 3),
        "threshold": TARGET_OTHER_FRACTION, "config": "ours + compile",
        "met": None if fraction is None else fraction <= TARGET_OTHER_FRACTION}
    return out


# --- the result file ----------------------------------------------------------------------------

def result_name(model: str, variant: str) -> str:
    """The JSON's name before the device: the model's key, and the variant where it is not the default."""
    return f"generate_video-{model}" + ("" if variant == MODELS[model].default else f"-{variant}")


# key: the type, or a dict of required keys of a nested object.
SCHEMA = {
    "env": {"device": str, "torch": str, "diffusers": str, "commit": str, "date": str},
    "model": {"key": str, "title": str, "class": str, "pipeline": str, "variant": str, "weights": str},
    "shape": {"frames": (int, type(None)), "height": int, "width": int, "videos": int, "passes": list,
              "tokens": int, "text_tokens": int, "dtype": str},
    "depth": {"scaled": bool, "layers": int, "full_layers": int, "unit": str, "method": (str, type(None))},
    "attention": {"requested": str, "chosen": str, "tolerance": float, "backends": list},
    "ours": {"status": str, "entry": (str, type(None))},
    "options": {"steps": int, "warmup_iterations": int, "guidance_scale": float, "compile_scope": str},
    "rows": list,
    "targets": dict,
    "timing": str,
}
ROW_SCHEMA = {"key": str, "config": str, "kernels": bool, "compile": bool}
MEASURED_ROW_SCHEMA = {"ms_per_step": float, "speedup": float, "rel_l2_vs_stock": float, "measured": dict}


def _check(obj, schema: dict, where: str) -> list[str]:
    problems = []
    for key, kind in schema.items():
        if key not in obj:
            problems.append(f"{where}{key}: missing")
        elif isinstance(kind, dict):
            problems += _check(obj[key], kind, f"{where}{key}.") if isinstance(obj[key], dict) else [
                f"{where}{key}: not an object"]
        elif not isinstance(obj[key], kind) or (kind is float and isinstance(obj[key], bool)):
            problems.append(f"{where}{key}: {type(obj[key]).__name__}, expected {kind}")
    return problems


def fp8_targets(rows: list[dict], model: str) -> dict:
    """Issue 37's speed targets from a run's rows: ours fp8 + compile against ours + compile (bf16) and
    against torchao fp8 + compile; for LTX-Video also the step time."""
    by = measured_rows(rows)
    f8, oc, ao = by.get("ours-fp8-compile"), by.get("ours-compile"), by.get("torchao-fp8-compile")
    ms = lambda row: row and row["ms_per_step"]  # noqa: E731
    speedup = oc["ms_per_step"] / f8["ms_per_step"] if f8 and oc else None
    out = {"speedup_over_ours_bf16_compile": {
               "value": speedup and round(speedup, 3), "threshold": TARGET_FP8_SPEEDUP,
               "met": None if speedup is None else speedup >= TARGET_FP8_SPEEDUP},
           "faster_than_torchao_fp8_compile": {
               "ours_ms": ms(f8), "torchao_ms": ms(ao),
               "met": None if not (f8 and ao) else f8["ms_per_step"] < ao["ms_per_step"]}}
    if model == "ltx":
        b2b = f8 and f8.get("ms_per_step_back_to_back")
        out["ltx_step_ms"] = {"value": ms(f8), "threshold": TARGET_FP8_LTX_MS,
                              "met": None if not f8 else f8["ms_per_step"] <= TARGET_FP8_LTX_MS,
                              "back_to_back": b2b, "met_back_to_back": None if not b2b else b2b <= TARGET_FP8_LTX_MS}
    return out


def schema_problems(data: dict) -> list[str]:
    """What a generate_video result lacks against SCHEMA (empty: it conforms)."""
    problems = _check(data, SCHEMA, "")
    for i, row in enumerate(data.get("rows", [])):
        problems += _check(row, ROW_SCHEMA, f"rows[{i}].")
        if "ms_per_step" in row:
            problems += _check(row, MEASURED_ROW_SCHEMA, f"rows[{i}].")
        elif "status" not in row:
            problems.append(f"rows[{i}]: neither measured nor a status")
    if data.get("depth", {}).get("scaled") and not data["depth"].get("method"):
        problems.append("depth: scaled without a method")
    return problems


# --- the chart ----------------------------------------------------------------------------------

COLOURS = {"gemm": "#4c72b0", "attention": "#dd8452", "other": "#c44e52"}


def chart_bars(data: dict) -> list[tuple[str, dict, float]]:
    """(configuration, {category: ms}, ms per step) of every measured row with a profile."""
    return [(r["config"], {c: r["profile"][f"{c}_ms"] for c in CATEGORIES}, r["ms_per_step"])
            for r in data["rows"] if r.get("profile")]


def chart_title(data: dict) -> str:
    m, s, d = data["model"], data["shape"], data["depth"]
    depth = f"scaled from {d['layers']} of {d['full_layers']} layers" if d["scaled"] else f"{d['full_layers']} layers"
    return (f"{m['title']} ({m['variant']}): {s['tokens']} tokens, batch {sum(s['passes'])}, {depth}; "
            f"{data['env']['device']}")


def write_chart(data: dict, stem: Path) -> Path:
    """Stacked bars, GPU time per step in GEMM / attention / other for each configuration: a PNG
    where matplotlib is installed, else an SVG written here. Returns the file written."""
    try:
        import matplotlib
    except ImportError:
        return write_svg(data, stem.with_name(stem.name + ".svg"))
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = chart_bars(data)
    fig, ax = plt.subplots(figsize=(1.8 * max(len(bars), 2) + 2, 4.5))
    bottoms = [0.0] * len(bars)
    for cat in CATEGORIES:
        values = [b[1][cat] for b in bars]
        ax.bar([b[0] for b in bars], values, bottom=bottoms, color=COLOURS[cat], label=cat)
        bottoms = [x + y for x, y in zip(bottoms, values)]
    for i, (_, _, ms) in enumerate(bars):
        ax.annotate(f"{ms:.1f} ms/step", (i, bottoms[i]), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("GPU time per step (ms)")
    ax.set_title(chart_title(data), fontsize=9)
    ax.legend()
    fig.tight_layout()
    path = stem.with_name(stem.name + ".png")  # not with_suffix: "ltx2-2.3" has a dot
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_svg(data: dict, path: Path) -> Path:
    bars = chart_bars(data)
    width, height, top, bottom, left = 140 * max(len(bars), 1) + 120, 360, 40, 60, 60
    peak = max((sum(b[1].values()) for b in bars), default=0.0) or 1.0
    scale = (height - top - bottom) / peak
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           'font-size="11">',
           f'<text x="10" y="20" font-size="12">{_escape(chart_title(data))}</text>',
           f'<text x="12" y="{height / 2:.0f}" transform="rotate(-90 12 {height / 2:.0f})">GPU ms per step</text>']
    for i, (name, cats, ms) in enumerate(bars):
        x, y = left + 140 * i + 20, height - bottom
        for cat in CATEGORIES:
            h = cats[cat] * scale
            y -= h
            out.append(f'<rect x="{x}" y="{y:.1f}" width="80" height="{h:.1f}" fill="{COLOURS[cat]}">'
                       f'<title>{cat} {cats[cat]:.1f} ms</title></rect>')
        out.append(f'<text x="{x + 40}" y="{y - 4:.1f}" text-anchor="middle">{ms:.1f} ms/step</text>')
        out.append(f'<text x="{x + 40}" y="{height - bottom + 16}" text-anchor="middle">{_escape(name)}</text>')
    for j, cat in enumerate(CATEGORIES):
        x = left + 110 * j
        out.append(f'<rect x="{x}" y="{height - 22}" width="12" height="12" fill="{COLOURS[cat]}"/>'
                   f'<text x="{x + 16}" y="{height - 12}">{cat}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")
    return path


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
