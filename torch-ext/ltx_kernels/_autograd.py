"""Which ops have a backward, and the refusal of a call autograd would record for the others.

:data:`DIFFERENTIABLE` names the public ops with a backward (registered with
``torch.library.register_autograd`` on a functional op; see each op's module):
called while autograd records, they run that op and return a result in the
graph. Every other op has no backward yet.

Those ops write into tensors they allocate (or into their inputs, in place)
through torch.library ops with no autograd formula, so their results carry no
``grad_fn``. Called while autograd records (grad mode on and an input that
requires grad), an op would silently cut the graph and ``backward()`` would
fail, or leave gradients missing, far from the cause. :func:`refuse_autograd`
raises :class:`NoBackwardError` at the call instead.

Every public op without a backward calls it first, before any other check, so the rule holds on
any device. Under ``torch.no_grad()`` / ``torch.inference_mode()`` it costs one
``torch.is_grad_enabled()``; with grad mode on, one ``requires_grad`` read per
tensor argument. Plain Python on tensor attributes: ``torch.compile`` traces it
(constants under its grad-mode and requires_grad guards).

Standard library and torch only: importable without the compiled library.
"""

from __future__ import annotations

import torch

# Public ops (``ltx_kernels.<name>``) with a backward. Issue 36 adds the others one by one.
DIFFERENTIABLE = frozenset({"rmsnorm", "rmsnorm_residual", "adaln_rmsnorm", "gated_residual",
                           "gated_residual_rmsnorm", "residual_tanh_gated_rmsnorm", "modulated_rmsnorm",
                           "layernorm", "adaln_layernorm", "gated_residual_layernorm", "gelu_tanh", "geglu",
                           "swiglu", "head_gate", "linear_gelu", "apply_rotary_emb", "rope_3d", "rope_1d",
                           "qk_rmsnorm_rope"})


def saves_statistics(ctx, *stats) -> None:
    """In a setup_context: `stats` (the forward's saved row statistics, also returned) take no grad, and
    the backward gets None, not zeros, for them and for any output outside the loss (autograd would
    otherwise launch a fill kernel per statistic on every backward: ~1 us each in a CUDA graph, H200,
    against a ~20 us LayerNorm backward at LTX-Video's rows)."""
    ctx.mark_non_differentiable(*stats)
    ctx.set_materialize_grads(False)


class NoBackwardError(RuntimeError):
    """An op of this package was called while autograd records (grad mode on and
    an input that requires grad), and it has no backward yet: its result would
    be cut from the graph. The message names the op, the argument, and what to
    do instead."""


def records_autograd(*tensors) -> bool:
    """Whether autograd records a call on ``tensors`` (None allowed): grad mode on and
    any of them requires grad."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def refuse_autograd(op: str, names: str, *tensors) -> None:
    """Raise :class:`NoBackwardError` when grad mode is on and any of ``tensors``
    (the op's tensor arguments, None for those not given; ``names`` their names,
    space-separated, in the same order) requires grad."""
    if not torch.is_grad_enabled():
        return
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            _refuse(op, names, tensors)


def refuse_constant_grads(op: str, names: str, differentiable: str, *tensors) -> None:
    """For a differentiable op whose backward treats some arguments as constants
    (RoPE tables, positions): raise :class:`NoBackwardError` naming those of
    ``tensors`` (``names``, space-separated) that require grad while grad mode
    is on. ``differentiable`` names the arguments that do get grads."""
    if not torch.is_grad_enabled():
        return
    needing = [f"`{name}`" for name, t in zip(names.split(), tensors)
               if isinstance(t, torch.Tensor) and t.requires_grad]
    if not needing:
        return
    raise NoBackwardError(
        f"ltx_kernels.{op}: {', '.join(needing)} {'requires' if len(needing) == 1 else 'require'} grad and grad "
        f"mode is on, but this op has no backward yet for {', '.join(needing)}: its backward gives grads for "
        f"{', '.join(f'`{n}`' for n in differentiable.split())} only and treats {', '.join(needing)} as "
        "constants. .detach() them (they need no gradient in training), call the op under torch.no_grad() or "
        "torch.inference_mode() for inference, or use the PyTorch reference code for their grads "
        "(ltx_kernels_diffusers.optimize runs the stock code for such ops while grad mode is on).")


def refuse_out(op: str, names: str, out_arg: str, *tensors) -> None:
    """A call autograd records that writes into a given output (``out``, ``inplace``):
    :class:`NoBackwardError`, as with torch's out= arguments."""
    needing = [f"`{name}`" for name, t in zip(names.split(), tensors)
               if isinstance(t, torch.Tensor) and t.requires_grad]
    raise NoBackwardError(
        f"ltx_kernels.{op}: {', '.join(needing)} {'requires' if len(needing) == 1 else 'require'} grad and "
        f"grad mode is on, but a call with `{out_arg}` has no backward (as with torch's out= arguments): call "
        f"it without `{out_arg}` to get a differentiable result, or under torch.no_grad() / "
        "torch.inference_mode() for inference.")


def _refuse(op: str, names: str, tensors) -> None:
    needing = [f"`{name}`" for name, t in zip(names.split(), tensors)
               if isinstance(t, torch.Tensor) and t.requires_grad]
    raise NoBackwardError(
        f"ltx_kernels.{op}: {', '.join(needing)} {'requires' if len(needing) == 1 else 'require'} grad and grad "
        "mode is on, but this op has no backward yet: its result would be cut from the autograd graph. "
        "For inference, call it under torch.no_grad() or torch.inference_mode(), or .detach() the inputs "
        "that need no gradient; to train, use the PyTorch reference code (ltx_kernels_diffusers.optimize "
        "runs the stock code for such ops while grad mode is on; ltx_kernels.DIFFERENTIABLE lists the ops "
        "with a backward).")
