"""optimize / restore / is_optimized: one entry point for every model of the
registry (``models``), dispatching on the transformer's diffusers class."""

from __future__ import annotations

from torch import nn

from .discovery import EXPECTED_TARGET, find_transformer, refuse_hooks
from .hub import load_kernel_if_supported
from .models import model_for, supported
from .models.base import make_options

STATE_ATTRIBUTE = "_ltx_kernels_state"


def optimize(target, *, kernel=None, exact_mode: bool = True, **options):
    """Rewire a diffusers pipeline's transformer (or the transformer itself) onto
    the fused ltx-kernels ops, in place; returns ``target``.

    The transformer's class picks the model (``models.MODELS``): LTX-Video 0.9
    (``LTXVideoTransformer3DModel``) and Mochi 1 (``MochiTransformer3DModel``).
    Any other model raises ``UnsupportedModelError`` naming its class and the
    supported ones, before anything is changed; so does a supported class whose
    modules are not the ones the integration was written for (every problem listed).

    - ``kernel``: the loaded ltx-kernels module (default ``load_kernel_if_supported()``,
      i.e. ``kernels.get_kernel("ltx-kernels/ltx-kernels", version=1)`` where it can run).
    - ``exact_mode=True``: every fused op reproduces diffusers' eager roundings;
      ``False`` rounds once per fused op.
    - ``**options``: the model's own options (``Options`` of its module), e.g.
      ``gelu_epilogue`` (LTX-Video) or ``fuse_attention`` (Mochi); an option the
      model does not take is a ``TypeError``, before anything is changed.

    Idempotent (the same options again change nothing; other options re-apply).
    Call it before ``enable_model_cpu_offload()``, group offloading, caches and
    ``torch.compile``: afterwards it raises ``HooksPresentError`` /
    ``CompiledModelError`` saying what to do, and changes nothing. Inference only:
    under autograd the stock code runs. Off Hopper (no CUDA GPU, another compute
    capability, no variant for this torch and CUDA) it returns ``target``
    untouched after one ``KernelUnavailableWarning`` saying why.
    """
    return optimize_with(target, None, kernel, exact_mode, options, entry="optimize", stacklevel=4)


def optimize_with(target, model, kernel, exact_mode: bool, options: dict, *, entry: str,
                  expected: str = EXPECTED_TARGET, stacklevel: int):
    """``optimize`` for ``model`` (a registry module; None: by the transformer's
    class). ``entry`` and ``expected`` word the errors; ``stacklevel`` points the
    off-Hopper warning at the user's call."""
    transformer = find_transformer(target, entry, expected)
    if model is None:
        model = model_for(transformer)
    elif not isinstance(transformer, model.CLASSES):
        model.check(transformer, None)  # raises, naming what the model is instead
        raise AssertionError(f"{model.__name__}.check accepted a {type(transformer).__name__}")
    opts = make_options(model, exact_mode, options, entry)
    state = transformer.__dict__.get(STATE_ATTRIBUTE)
    if state is not None and state.options == opts and kernel in (None, state.kernel):
        return target  # already optimised this way (hooks added since are fine: they wrap the fused forwards)
    refuse_hooks(transformer, entry)
    if state is not None:
        _restore_transformer(transformer)
    plan = model.check(transformer, opts)
    if kernel is None:
        kernel = load_kernel_if_supported(stacklevel=stacklevel)
        if kernel is None:
            return target  # it cannot run here; one KernelUnavailableWarning said why
    model.check_kernel(kernel)
    transformer.__dict__[STATE_ATTRIBUTE] = model.apply(plan, kernel, opts)
    return target


def _restore_transformer(transformer: nn.Module) -> None:
    state = transformer.__dict__.get(STATE_ATTRIBUTE)
    if state is None:
        return
    model_for(transformer).restore(transformer, state)
    del transformer.__dict__[STATE_ATTRIBUTE]


def restore(target):
    """Undo ``optimize`` (or ``optimize_ltx``) on a pipeline's transformer (or the
    transformer): its stock forwards and attention processors again. A no-op on
    a model that is not optimised. Returns ``target``."""
    _restore_transformer(find_transformer(target))
    return target


def is_optimized(target) -> bool:
    """Whether ``optimize`` (or ``optimize_ltx``) is in effect on ``target``'s transformer."""
    return STATE_ATTRIBUTE in find_transformer(target).__dict__


__all__ = ["optimize", "restore", "is_optimized", "supported", "STATE_ATTRIBUTE"]
