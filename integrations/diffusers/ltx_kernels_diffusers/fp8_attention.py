"""Self-attention on cuDNN's FP8 SDPA (issue 37, item 5), through cudnn-frontend's graph API
(``pip install nvidia-cudnn-frontend``; imported only when ``fp8_attention=True`` asks for it).

q, k and v (bf16 ``[B, S, H, Dh]``) are quantised to float8_e4m3 with one scale per tensor
(``amax / 448``); cuDNN keeps the softmax probabilities in e4m3 at a scale of 448 (they lie in
[0, 1]) and, on Hopper, writes the output in e4m3 too: no bf16 output from FP8 inputs before
Blackwell. The output takes v's scale, which cannot overflow (each output row is a convex
combination of v's rows), so it goes to the FP8 output projection as e4m3 rows with that one scale
per row, with no quantisation pass. Error and speed: docs/fp8.md, "Attention in 8 bits".
"""

from __future__ import annotations

import atexit
from typing import Dict, List, Tuple

import torch

Tensor = torch.Tensor
E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
OP = "ltx_kernels_diffusers::fp8_sdpa"


def unavailable() -> str:
    """Why cuDNN's FP8 SDPA cannot run here ('' where it can)."""
    try:
        import cudnn
    except ImportError as e:
        return f"cudnn-frontend is not installed ({e}; pip install nvidia-cudnn-frontend)"
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        return "cuDNN's FP8 SDPA needs a CUDA GPU of compute capability 9.0 or newer"
    if cudnn.backend_version() < 90100:
        return f"cuDNN {cudnn.backend_version()} is older than 9.1 (FP8 SDPA forward)"
    return ""


def option_problems(options) -> List[str]:
    """What a model's ``Options`` with ``fp8_attention`` cannot run (before anything changes)."""
    if not options.fp8_attention:
        return []
    why = unavailable() if options.fp8 and options.fuse_attention else "it needs fp8=True and fuse_attention=True"
    return [f"fp8_attention: {why}"] if why else []


def quantize_per_tensor(t: Tensor) -> Tuple[Tensor, Tensor]:
    """``t`` as e4m3 at one scale, and the float32 descale ``[1, 1, 1, 1]`` (1 for all zeros). Plain
    torch, so torch.compile fuses it into two kernels (the amax, then the cast)."""
    amax = torch.linalg.vector_norm(t, ord=float("inf"), dtype=torch.float32)
    descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax)).reshape(1, 1, 1, 1)
    return (t.float() / descale).to(E4M3), descale


class _Graph:
    """One built cuDNN graph for one set of shapes and strides: q/k/v/o as ``[B, H, S, Dh]`` views of
    ``[B, S, H, Dh]`` memory."""

    def __init__(self, q: Tensor, k: Tensor, v: Tensor):
        import cudnn

        self.handle, self.set_stream = cudnn.create_handle(), cudnn.set_stream
        g = cudnn.pygraph(io_data_type=cudnn.data_type.FP8_E4M3, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=self.handle)
        scalar = torch.ones(1, 1, 1, 1, device=q.device)
        self.inputs = {n: g.tensor_like(t.transpose(1, 2)) for n, t in zip("qkv", (q, k, v))}
        names = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
        self.inputs.update({n: g.tensor_like(scalar) for n in names})
        self.probability_scales = {"descale_s": scalar / E4M3_MAX, "scale_s": scalar * E4M3_MAX}
        o, _, amax_s, amax_o = g.sdpa_fp8(**{n: self.inputs[n] for n in ("q", "k", "v", *names)}, is_inference=True,
                                          attn_scale=q.shape[-1] ** -0.5, use_causal_mask=False)
        o_shape = (*q.shape[:-1], v.shape[-1])
        o_view = torch.empty(o_shape, device=q.device, dtype=E4M3).transpose(1, 2)
        o.set_output(True).set_dim(list(o_view.shape)).set_stride(list(o_view.stride()))
        o.set_data_type(cudnn.data_type.FP8_E4M3)
        self.o = o
        # the amaxes cuDNN writes (for delayed scaling; not read here): one buffer each, shared by every call
        self.amax = {node: torch.empty(1, 1, 1, 1, device=q.device) for node in (amax_s, amax_o)}
        for node in self.amax:
            node.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(cudnn.data_type.FLOAT)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        self.graph, self.o_shape = g, o_shape
        self.workspace = torch.empty(g.get_workspace_size(), device=q.device, dtype=torch.uint8)

    def __call__(self, q, k, v, dq, dk, dv) -> Tensor:
        out = torch.empty(self.o_shape, device=q.device, dtype=E4M3)
        feed = {"q": q.transpose(1, 2), "k": k.transpose(1, 2), "v": v.transpose(1, 2), "descale_q": dq,
                "descale_k": dk, "descale_v": dv, "scale_o": 1 / dv, **self.probability_scales}
        pack = {self.inputs[n]: t for n, t in feed.items()}
        pack.update({self.o: out.transpose(1, 2), **self.amax})
        self.set_stream(handle=self.handle, stream=torch.cuda.current_stream(q.device).cuda_stream)
        self.graph.execute(pack, self.workspace, handle=self.handle)
        return out


_GRAPHS: Dict[tuple, _Graph] = {}
# Free the cuDNN graphs before the interpreter tears cudnn's module down; otherwise nanobind reports
# each one as a leaked instance at exit.
atexit.register(_GRAPHS.clear)


def _key(*ts: Tensor) -> tuple:
    return tuple((tuple(t.shape), t.stride(), t.device.index) for t in ts)


@torch.library.custom_op(OP, mutates_args=())
def fp8_sdpa(q: Tensor, k: Tensor, v: Tensor, descale_q: Tensor, descale_k: Tensor, descale_v: Tensor) -> Tensor:
    """Attention of e4m3 ``[B, S, H, Dh]`` q/k/v (no mask, scale ``Dh**-0.5``), each with its float32
    descale ``[1, 1, 1, 1]``; returns the e4m3 output ``[B, S, H, Dv]``, whose descale is ``descale_v``."""
    key = _key(q, k, v)
    graph = _GRAPHS.get(key)
    if graph is None:
        graph = _GRAPHS[key] = _Graph(q, k, v)
    return graph(q, k, v, descale_q, descale_k, descale_v)


@fp8_sdpa.register_fake
def _(q, k, v, descale_q, descale_k, descale_v):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


def fp8_self_attention(query: Tensor, key: Tensor, value: Tensor) -> Tuple[Tensor, Tensor]:
    """bf16 ``[B, S, H, Dh]`` q/k/v to ``(o, descale)``: the e4m3 output ``[B, S, H, Dv]`` and its
    float32 descale ``[1, 1, 1, 1]``."""
    (q, dq), (k, dk), (v, dv) = (quantize_per_tensor(t) for t in (query, key, value))
    return fp8_sdpa(q, k, v, dq, dk, dv), dv


def dequantize(out: Tensor, descale: Tensor, dtype: torch.dtype) -> Tensor:
    """The e4m3 attention output's values in ``dtype``."""
    return (out.float() * descale.reshape(())).to(dtype)


def projection_input(kernel, linear, out: Tensor, descale: Tensor, dtype: torch.dtype):
    """The e4m3 attention output ``[..., K]`` (a flattened ``[B, S, H*Dv]``) as ``linear``'s input: for
    the kernel's ``Fp8Linear``, ``Fp8Rows`` of its data with the one descale as every row's scale (no
    quantisation pass); for another linear, its values in ``dtype``."""
    if not isinstance(linear, kernel.Fp8Linear):
        return dequantize(out, descale, dtype)
    data = out.contiguous()
    return kernel.Fp8Rows(data, descale.reshape(()).expand(data.shape[:-1]).contiguous())


def output_projection(kernel, attn, out: Tensor, descale: Tensor, dtype: torch.dtype) -> Tensor:
    """``attn.to_out`` (the projection, then its dropout) on the e4m3 attention output ``[..., K]``."""
    return attn.to_out[1](attn.to_out[0](projection_input(kernel, attn.to_out[0], out, descale, dtype)))


__all__ = ["unavailable", "option_problems", "quantize_per_tensor", "fp8_sdpa", "fp8_self_attention", "dequantize",
           "projection_input", "output_projection"]
