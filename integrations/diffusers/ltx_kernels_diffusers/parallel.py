"""Context-parallel plans for diffusers' ``enable_parallelism`` (issue 38), where diffusers 0.42.1's own
does not run.

``LTX2VideoTransformer3DModel._cp_plan`` is LTX-Video's: it splits the video stream and its RoPE table
but not the audio stream, the text of the audio stream or the cross-modal RoPE tables, so the first
a2v/v2a attention meets a whole-sequence table with half the tokens (stock and optimised alike).
:func:`context_parallel_plan` gives LTX-2 a plan that works. For the stock model it splits every stream
(video, audio, both texts) along its sequence and every RoPE table with it, and gathers both outputs; its
processors all-to-all around each of a block's six attentions (24 exchanges). For an optimised model it
splits the video stream and its tables alone: the text and the audio stream (126 tokens at 121 frames)
stay whole on every rank, and the fused processors attend to them locally (``models/ltx2.py``'s
``CP_MODES``): the video self-attention all-to-alls as before, v2a gathers the video keys and values, the
rest exchange nothing (6 exchanges a block). That is for inference: with the whole streams computed on
every rank, gradients through them would be wrong, so those attentions raise when grads flow (diffusers
0.42.1's Ulysses backward fails on LTX-2's cross-attentions for the stock model too). For every other
model it returns None: diffusers' own.

    transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2),
                                   cp_plan=context_parallel_plan(transformer))
"""

from __future__ import annotations

from typing import Optional

from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

from .discovery import find_transformer

# LTX-2's streams (forward arguments, [B, S, D]), RoPE modules ((cos, sin) per token) and output
# projections: the video's, then the ones an optimised model keeps whole (audio and text).
VIDEO = {"streams": ("hidden_states",), "ropes": ("rope", "cross_attn_rope"), "outputs": ("proj_out",)}
WHOLE = {"streams": ("audio_hidden_states", "encoder_hidden_states", "audio_encoder_hidden_states"),
         "ropes": ("audio_rope", "cross_attn_audio_rope"), "outputs": ("audio_proj_out",)}


def ltx2_plan(rope_type: str, video_only: bool = False) -> dict:
    """The plan for an LTX-2 transformer whose RoPE is ``rope_type``: "interleaved" tables are
    [B, S, D], "split" ones [B, H, S, D / 2H]. ``video_only``: the video stream and its tables
    split, the rest whole."""
    stream = ContextParallelInput(split_dim=1, expected_dims=3, split_output=False)
    dim, dims = (2, 4) if rope_type == "split" else (1, 3)
    table = ContextParallelInput(split_dim=dim, expected_dims=dims, split_output=True)
    parts = (VIDEO,) if video_only else (VIDEO, WHOLE)
    return {"": {name: stream for part in parts for name in part["streams"]},
            **{rope: {0: table, 1: table} for part in parts for rope in part["ropes"]},
            **{out: ContextParallelOutput(gather_dim=1, expected_dims=3) for part in parts for out in part["outputs"]}}


def context_parallel_plan(target) -> Optional[dict]:
    """The ``cp_plan`` to pass to ``enable_parallelism`` for ``target``'s transformer (a pipeline or the
    transformer): LTX-2's (:func:`ltx2_plan`), None for any other model (diffusers' own). Text masks are
    not split: with a mask, Ulysses on the native backend fails in diffusers 0.42.1 (docs/integration.md).
    Call it after ``optimize``: where every attention runs a fused processor, the plan splits the video
    alone and sets each processor's ``cp_mode`` to match (the plan and the processors go together)."""
    from diffusers import LTX2VideoTransformer3DModel

    from .models.ltx2 import CP_MODES, ContextMode, fusable

    transformer = find_transformer(target, "context_parallel_plan")
    if not isinstance(transformer, LTX2VideoTransformer3DModel):
        return None
    attentions = [(getattr(block, name), mode) for block in transformer.transformer_blocks
                  for name, mode in CP_MODES.items()]
    video_only = all(isinstance(attn.processor, ContextMode) and fusable(attn) for attn, _ in attentions)
    for attn, mode in attentions:
        if isinstance(attn.processor, ContextMode):
            attn.processor.cp_mode = mode if video_only else "sequence"
    return ltx2_plan(transformer.config.rope_type, video_only)


__all__ = ["context_parallel_plan", "ltx2_plan"]
