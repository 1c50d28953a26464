"""Attention the way diffusers runs it: ``dispatch_attention_fn`` with the
processor's own backend and parallel config, so ``set_attention_backend`` (which
sets ``_attention_backend`` on every processor that has the attribute) and
context parallelism still apply to the fused processors."""

from __future__ import annotations

from typing import Optional

import torch
from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn
from torch.nn.attention import SDPBackend, sdpa_kernel

# With diffusers' native backend (F.scaled_dot_product_attention), cuDNN first: on an H200 it is 1.6x flash
# for LTX's self-attention and 2x memory-efficient for its masked cross-attention
# (benchmarks/bench_attention.py); the others stay as fallbacks for calls cuDNN refuses.
SDPA_PRIORITY = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                 SDPBackend.MATH]


_OWN = object()  # `parallel_config` not given: the processor's own


class DispatchedAttention:
    """Mixin of the fused processors (listed first, before the stock processor
    they extend): the kernel and options they run with, the two attributes
    diffusers' backend machinery looks for, and :meth:`attention` on
    ``[B, S, H, Dh]`` q/k/v."""

    _attention_backend = None
    _parallel_config = None
    prefer_cudnn_attention: bool = True
    fp8_attention: bool = False  # this attention on cuDNN's FP8 SDPA (fp8_attention.py), from its model's apply

    @property
    def runs_fp8_attention(self) -> bool:
        """``fp8_attention``, unless a backend set with ``set_attention_backend`` or context parallelism
        is in play (those keep the bf16 attention)."""
        return self.fp8_attention and self._attention_backend is None and self._parallel_config is None

    def __init__(self, kernel, exact_mode: bool = True, prefer_cudnn_attention: bool = True,
                 fp8_attention: bool = False):
        super().__init__()  # the stock processor's (no arguments)
        self.kernel = kernel
        self.exact_mode = exact_mode
        self.prefer_cudnn_attention = prefer_cudnn_attention
        self.fp8_attention = fp8_attention

    def attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attn_mask: Optional[torch.Tensor], parallel_config=_OWN) -> torch.Tensor:
        """``parallel_config``: the processor's own unless given (Wan's stock
        processor passes None for its cross-attention calls)."""
        if parallel_config is _OWN:
            parallel_config = self._parallel_config

        def run(backend):
            return dispatch_attention_fn(query, key, value, attn_mask=attn_mask, dropout_p=0.0, is_causal=False,
                                         backend=backend, parallel_config=parallel_config)

        backend = self._attention_backend
        if self.prefer_cudnn_attention and backend is None and query.is_cuda:
            with sdpa_kernel(SDPA_PRIORITY, set_priority=True):
                return run(None)
        if backend == AttentionBackendName._NATIVE_CUDNN and parallel_config is None:
            # The same cuDNN kernel through the native backend: diffusers' cuDNN backend makes q, k and v
            # contiguous as [B, H, S, Dh] first and its output is a transposed view that the caller's
            # flatten copies (Wan 1.3B on an H200: 1.7 ms a block); PyTorch's cuDNN attention takes the
            # [B, S, H, Dh] views as they are and writes its output in that layout.
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return run(AttentionBackendName.NATIVE)
        return run(backend)


__all__ = ["SDPA_PRIORITY", "DispatchedAttention"]
