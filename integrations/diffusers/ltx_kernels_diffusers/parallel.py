"""Context-parallel plans for diffusers' ``enable_parallelism`` (issue 38), where diffusers 0.42.1's own
does not run.

``LTX2VideoTransformer3DModel._cp_plan`` is LTX-Video's: it splits the video stream and its RoPE table
but not the audio stream, the text of the audio stream or the cross-modal RoPE tables, so the first
a2v/v2a attention meets a whole-sequence table with half the tokens (stock and optimised alike).
:func:`context_parallel_plan` gives LTX-2 a plan that splits the video and audio streams along their
sequence and every RoPE table with them, and gathers both outputs. The text is split too for the stock
model (its processors all-to-all every attention); an optimised model keeps the text whole on every rank
and its two text cross-attentions attend locally, which saves 8 of a block's 24 all-to-alls. For every
other model it returns None: diffusers' own.

    transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2),
                                   cp_plan=context_parallel_plan(transformer))
"""

from __future__ import annotations

from typing import Optional

from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

from .discovery import find_transformer

# LTX-2's streams (forward arguments, [B, S, D]) and RoPE modules ((cos, sin) per token).
LTX2_STREAMS = ("hidden_states", "audio_hidden_states")
LTX2_TEXT = ("encoder_hidden_states", "audio_encoder_hidden_states")
LTX2_ROPES = ("rope", "audio_rope", "cross_attn_rope", "cross_attn_audio_rope")


def ltx2_plan(rope_type: str, whole_text: bool = False) -> dict:
    """The plan for an LTX-2 transformer whose RoPE is ``rope_type``: "interleaved" tables are
    [B, S, D], "split" ones [B, H, S, D / 2H]. ``whole_text``: the text streams are not split."""
    stream = ContextParallelInput(split_dim=1, expected_dims=3, split_output=False)
    dim, dims = (2, 4) if rope_type == "split" else (1, 3)
    table = ContextParallelInput(split_dim=dim, expected_dims=dims, split_output=True)
    return {"": dict.fromkeys(LTX2_STREAMS + (() if whole_text else LTX2_TEXT), stream),
            **{rope: {0: table, 1: table} for rope in LTX2_ROPES},
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3),
            "audio_proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3)}


def context_parallel_plan(target) -> Optional[dict]:
    """The ``cp_plan`` to pass to ``enable_parallelism`` for ``target``'s transformer (a pipeline or the
    transformer): LTX-2's (:func:`ltx2_plan`), None for any other model (diffusers' own). Text masks are
    not split: with a mask, Ulysses on the native backend fails in diffusers 0.42.1 (docs/integration.md).
    Call it after ``optimize``: where every text cross-attention runs a fused processor, the plan keeps
    the text whole and those processors are set to attend to it locally (the plan and the processors go
    together)."""
    from diffusers import LTX2VideoTransformer3DModel

    from .models.ltx2 import FusedLTX2AttnProcessor, fusable

    transformer = find_transformer(target, "context_parallel_plan")
    if not isinstance(transformer, LTX2VideoTransformer3DModel):
        return None
    text_attentions = [attn for block in transformer.transformer_blocks for attn in (block.attn2, block.audio_attn2)]
    whole_text = all(isinstance(attn.processor, FusedLTX2AttnProcessor) and fusable(attn) for attn in text_attentions)
    for attn in text_attentions:
        if isinstance(attn.processor, FusedLTX2AttnProcessor):
            attn.processor.whole_text = whole_text
    return ltx2_plan(transformer.config.rope_type, whole_text)


__all__ = ["context_parallel_plan", "ltx2_plan"]
