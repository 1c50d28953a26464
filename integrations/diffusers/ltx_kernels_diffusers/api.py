"""optimize / restore / is_optimized: one entry point for every model of the
registry (``models``), dispatching on the transformer's diffusers class; and
optimize_ltx, the LTX-Video-only form it grew from (same options, behaviour and
errors; a model that is not LTX-Video 0.9 is refused naming what it is)."""

from __future__ import annotations

from torch import nn

from .autograd import autograd_kernel, unwrap
from .cuda_graph import SEAM as CUDA_GRAPH_SEAM
from .cuda_graph import CudaGraphHook, cuda_graph_hook
from .discovery import EXPECTED_TARGET, find_transformer, refuse_hooks
from .errors import HooksPresentError
from .hooks import hooked_by_accelerate, install_hook, invalidate_registry_caches, uninstall
from .hub import load_kernel_if_supported
from .models import ltx_video, model_for, supported
from .models.base import make_options

STATE_ATTRIBUTE = "_ltx_kernels_state"
GRAPH_ATTRIBUTE = "_ltx_kernels_cuda_graph"  # the InstalledHook of cuda_graph=True


def optimize(target, *, kernel=None, exact_mode: bool = True, cuda_graph: bool = False, **options):
    """Rewire a diffusers pipeline's transformer (or the transformer itself) onto
    the fused ltx-kernels ops, in place; returns ``target``.

    The transformer's class picks the model (``models.MODELS``): LTX-Video 0.9
    (``LTXVideoTransformer3DModel``), LTX-2 (``LTX2VideoTransformer3DModel``, 2.0 and 2.3),
    Mochi 1 (``MochiTransformer3DModel``),
    Wan 2.1 / 2.2 (``WanTransformer3DModel``; a Wan 2.2 A14B pipeline's
    ``transformer_2`` takes its own call) and Flux.1 (``FluxTransformer2DModel``).
    Any other model raises ``UnsupportedModelError`` naming its class and the
    supported ones, before anything is changed; so does a supported class whose
    modules are not the ones the integration was written for (every problem listed).

    - ``kernel``: the loaded ltx-kernels module (default ``load_kernel_if_supported()``,
      i.e. ``kernels.get_kernel("ltx-kernels/ltx-kernels", version=1)`` where it can run).
    - ``exact_mode=True``: every fused op reproduces diffusers' eager roundings;
      ``False`` rounds once per fused op.
    - ``**options``: the model's own options (``Options`` of its module), e.g.
      ``gelu_epilogue`` (LTX-Video, LTX-2, Wan, Flux) or ``fuse_attention`` (all but
      LTX-Video); an option the model does not take is a ``TypeError``, before anything is changed.
    - ``cuda_graph=True`` (every model, off by default): inference calls replay the whole forward
      from a CUDA graph captured per input signature, for steps the host cannot launch fast enough
      (``cuda_graph.py`` lists when it runs the forward as it is instead, and what it cannot see).

    Idempotent (the same options again change nothing; other options re-apply).
    Call it before ``enable_model_cpu_offload()``, group offloading, caches and
    ``torch.compile``: afterwards it raises ``HooksPresentError`` /
    ``CompiledModelError`` saying what to do, and changes nothing. Under autograd
    (training, e.g. LoRA) each fused op runs on the kernel where it has a backward
    (``ltx_kernels.DIFFERENTIABLE``) and as diffusers' eager code where not
    (``autograd.AutogradKernel``). Off Hopper (no CUDA GPU, another compute
    capability, no variant for this torch and CUDA) it returns ``target``
    untouched after one ``KernelUnavailableWarning`` saying why.
    """
    return optimize_with(target, None, kernel, exact_mode, options, entry="optimize", stacklevel=4,
                         cuda_graph=cuda_graph)


def optimize_with(target, model, kernel, exact_mode: bool, options: dict, *, entry: str,
                  expected: str = EXPECTED_TARGET, stacklevel: int, cuda_graph: bool = False):
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
    if (state is not None and state.options == opts and kernel in (None, unwrap(state.kernel))
            and (GRAPH_ATTRIBUTE in transformer.__dict__) == cuda_graph):
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
    # the fused forwards call the kernel through AutogradKernel: each op on the kernel, or as stock code
    # where autograd records it and the kernel has no backward for it
    transformer.__dict__[STATE_ATTRIBUTE] = model.apply(plan, autograd_kernel(kernel), opts)
    if cuda_graph:  # outermost: the graph holds every fused forward
        transformer.__dict__[GRAPH_ATTRIBUTE] = install_hook(transformer, CUDA_GRAPH_SEAM, CudaGraphHook())
        invalidate_registry_caches(transformer)
    return target


LTX_TARGET = "an LTX-Video pipeline (an object with a `.transformer`) or its LTXVideoTransformer3DModel"


def optimize_ltx(target, *, kernel=None, exact_mode: bool = True, gelu_epilogue: bool = True,
                 prefer_cudnn_attention: bool = True, cuda_graph: bool = False):
    """Rewire an LTX-Video pipeline's transformer (or the transformer itself)
    onto the fused ltx-kernels ops, in place; returns ``target``.

    - ``kernel``: the loaded ltx-kernels module (default: ``load_kernel_if_supported()``,
      i.e. ``kernels.get_kernel("ltx-kernels/ltx-kernels", version=1)`` where it can run).
    - ``exact_mode=True`` (default): every fused op reproduces diffusers' eager
      roundings (see the ops' docs); ``False`` rounds once per fused op.
    - ``gelu_epilogue=True`` (default): the feed-forward up-projection and its
      GELU-tanh run as one GEMM with the GELU epilogue, which rounds once where
      eager rounds the projection and then the GELU (the only fusion here with
      no bitwise form); ``False`` runs the projection, then the GELU-tanh kernel
      (bitwise ``F.gelu``).
    - ``prefer_cudnn_attention=True`` (default): with diffusers' native attention
      backend, ``F.scaled_dot_product_attention`` tries cuDNN first, then flash,
      memory-efficient and math (fastest at LTX's shapes on Hopper;
      docs/performance.md, "Attention backends"). A backend set with ``set_attention_backend`` wins.
    - ``cuda_graph=True``: the forward replayed from a CUDA graph, as in ``optimize``.

    Idempotent (a second call with the same options changes nothing; with other
    options it re-applies). Call it before ``enable_model_cpu_offload()`` and
    before ``torch.compile``; afterwards it raises HooksPresentError /
    CompiledModelError saying what to do. A model it does not recognise raises
    UnsupportedModelError listing why, before anything is changed. Under
    autograd each op runs with its backward or as stock code, as in ``optimize``.

    Off Hopper it steps aside: without a CUDA GPU, on a GPU of another compute
    capability, or where no variant matches the installed torch and CUDA, it
    returns ``target`` untouched (``is_optimized`` False) after exactly one
    ``KernelUnavailableWarning`` naming the GPU's capability (or "no CUDA GPU"),
    torch and its CUDA, and the variants on offer (``hub.load_kernel_if_supported``).
    """
    return optimize_with(target, ltx_video, kernel, exact_mode,
                         dict(gelu_epilogue=gelu_epilogue, prefer_cudnn_attention=prefer_cudnn_attention),
                         entry="optimize_ltx", expected=LTX_TARGET, stacklevel=4, cuda_graph=cuda_graph)


def _restore_transformer(transformer: nn.Module) -> None:
    state = transformer.__dict__.get(STATE_ATTRIBUTE)
    if state is None:
        return
    if GRAPH_ATTRIBUTE in transformer.__dict__ and hooked_by_accelerate(transformer):
        raise HooksPresentError(
            "ltx_kernels_diffusers: restore found accelerate's hook (enable_model_cpu_offload) wrapping the CUDA graph "
            "of cuda_graph=True, and removing the graph would drop it; nothing was changed. For a pipeline: "
            "pipe.remove_all_hooks(), restore(pipe), then pipe.enable_model_cpu_offload() again.")
    graph = transformer.__dict__.pop(GRAPH_ATTRIBUTE, None)
    hook = cuda_graph_hook(transformer)
    if graph is not None:  # first: the model's restore checks that its own forwards are the outermost
        uninstall(graph)
    try:
        model_for(transformer).restore(transformer, state)  # raises, changing nothing, where it cannot
    except Exception:
        if graph is not None:
            transformer.__dict__[GRAPH_ATTRIBUTE] = install_hook(transformer, CUDA_GRAPH_SEAM, hook)
        raise
    finally:
        invalidate_registry_caches(transformer)
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


__all__ = ["optimize", "optimize_ltx", "restore", "is_optimized", "supported", "STATE_ATTRIBUTE", "GRAPH_ATTRIBUTE"]
