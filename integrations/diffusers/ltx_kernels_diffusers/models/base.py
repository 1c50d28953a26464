"""What every model module of the registry provides, and helpers they share.

A model module (``models/<model>.py``) defines:

- ``NAME``: the model family as users know it (``"Mochi 1"``);
- ``CLASSES``: the diffusers transformer classes it serves;
- ``Options``: a frozen dataclass, ``exact_mode`` first, then the model's own
  options with their defaults (``optimize(..., **options)`` takes them by name);
- ``check(transformer, options)``: every module it would change, or
  ``UnsupportedModelError`` listing every problem; it changes nothing;
- ``check_kernel(kernel)``: ``TypeError`` when the kernel lacks an op it calls;
- ``apply(plan, kernel, options)``: rewires the modules ``check`` returned and
  returns a state with ``.kernel`` and ``.options``;
- ``restore(transformer, state)``: undoes ``apply``, or raises
  ``HooksPresentError`` and changes nothing.

``api.optimize`` does the rest (finding the transformer, refusing compiled
models and other hooks, idempotence, loading the kernel or stepping aside).

The models whose fused code is installed as diffusers hooks and attention
processors (LTX-2, Mochi, Flux, Wan) share :class:`HookedState`, :func:`install_processor`
and :func:`restore_hooked`.

A model that takes ``fp8=True`` also defines ``FP8_LINEARS``: the block linears
(paths from a block of ``transformer_blocks``) it runs as ``Fp8Linear``;
:func:`fp8_problems`, :func:`swap_fp8` and :func:`unswap_fp8` do the swap.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

import torch
from diffusers.models.activations import GELU
from diffusers.models.attention import FeedForward
from torch import Tensor, nn

from ..errors import HooksPresentError
from ..hooks import InstalledHook, hooked_by_accelerate, invalidate_registry_caches, uninstall, weights_managed_by_hooks


def computed_once(t: Tensor) -> Tensor:
    """``t``, as a view that makes torch.compile compute it into one buffer.

    Our ops are opaque to inductor, so each needs its inputs as buffers. A view
    (unbind, chunk) of a tensor not yet computed, such as ``table + temb``, is then
    computed again for every op that reads a piece: a launch each, 24 more per
    LTX-2 block than stock compile. Pieces of an ``as_strided`` alias are views of
    one buffer. Eager: the same tensor, a view."""
    return t.as_strided(t.shape, t.stride())


def check_kernel_functions(kernel, functions: Iterable[str], namespaces: Mapping[str, Iterable[str]] = {}) -> None:
    """TypeError naming every function (``name`` or ``namespace.name``) the kernel lacks."""
    missing = [name for name in functions if not callable(getattr(kernel, name, None))]
    for namespace, names in namespaces.items():
        holder = getattr(kernel, namespace, None)
        missing += [f"{namespace}.{name}" for name in names if not callable(getattr(holder, name, None))]
    if missing:
        raise TypeError(f"ltx_kernels_diffusers: the kernel {getattr(kernel, '__name__', kernel)!r} lacks "
                        f"{', '.join(missing)}; it needs an ltx-kernels build with the diffusers integration "
                        "(rebuild with `python3 -m ltx_build build` or update the Hub kernel)")


def make_options(model, exact_mode: bool, options: Dict[str, object], entry: str):
    """``model.Options`` from the call's keyword arguments; TypeError naming the
    model's options for a name it does not take."""
    defaults = {f.name: f.default for f in fields(model.Options) if f.name != "exact_mode"}
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise TypeError(f"ltx_kernels_diffusers: {entry} got {', '.join(map(repr, unknown))}, which {model.NAME} "
                        f"does not take; its options: exact_mode, {', '.join(defaults)}. Nothing was changed.")
    # flags as flags: a truthy value and True must compare equal for idempotence
    return model.Options(exact_mode=bool(exact_mode), **{
        name: bool(value) if isinstance(defaults[name], bool) else value for name, value in options.items()})


def plain(module: nn.Module, cls: type) -> bool:
    """``module`` is a ``cls`` whose class keeps ``cls``'s forward."""
    return isinstance(module, cls) and type(module).forward is cls.forward


def transformer_problems(model: nn.Module, cls: type, blocks_attr: str, block_problems) -> List[str]:
    """What ``check`` refuses in any model: another class, a subclass with its own forward, no
    blocks; then ``block_problems(block, where)`` for each block of ``model.<blocks_attr>``."""
    if not isinstance(model, cls):
        return [f"the model is {type(model).__qualname__}, not diffusers' {cls.__name__}"]
    problems = []
    if not plain(model, cls):
        problems.append(f"the model is a subclass of {cls.__name__} with its own forward")
    blocks = getattr(model, blocks_attr, None)
    if not isinstance(blocks, nn.ModuleList) or len(blocks) == 0:
        problems.append(f"model.{blocks_attr} is not a non-empty ModuleList")
    else:
        for index, block in enumerate(blocks):
            problems += block_problems(block, f"{blocks_attr}.{index}")
    return problems


# --- the feed-forward's GELU-tanh (LTX-2, Wan, Flux) ---------------------------------------------------------


def _fits_epilogue(proj: nn.Module) -> bool:
    """A plain ``nn.Linear`` with a bias whose weights stay in place (a LoRA- or
    quantisation-wrapped or offloaded projection keeps its own forward)."""
    return type(proj) is nn.Linear and proj.bias is not None and not weights_managed_by_hooks(proj)


def linear_gelu_tanh(kernel, proj: nn.Module, x: Tensor, epilogue: bool) -> Tensor:
    """``F.gelu(proj(x), approximate="tanh")``: one GEMM with the GELU epilogue
    (``epilogue`` and a projection that fits), else the projection, then ``gelu_tanh``."""
    if epilogue and _fits_epilogue(proj):
        return kernel.linear_gelu(x, proj.weight, proj.bias)
    return kernel.gelu_tanh(proj(x))


def gelu_forward(act: GELU, hidden_states: Tensor, *, kernel, epilogue: bool) -> Tensor:
    """diffusers' ``GELU(approximate="tanh")`` (``ff.net[0]``): ``proj``, then GELU-tanh."""
    return linear_gelu_tanh(kernel, act.proj, hidden_states, epilogue)


def tanh_gelu_of(ff: Optional[nn.Module]) -> Optional[GELU]:
    """The feed-forward's ``GELU(approximate="tanh")`` (``ff.net[0]``); other activations stay as they are."""
    if not plain(ff, FeedForward):
        return None
    act = ff.net[0]
    return act if type(act) is GELU and act.approximate == "tanh" else None


# --- FP8 linears (optimize(..., fp8=True)) ---------------------------------------------------------------

# (parent, attribute, the original linear, its Fp8Linear), for restore
SwappedLinear = Tuple[nn.Module, str, nn.Module, nn.Module]


def rows_shape(x) -> torch.Size:
    """The shape of a tensor, or of the e4m3 rows (``Fp8Rows``, a named tuple) fp8=True gives the projections."""
    return x[0].shape if isinstance(x, tuple) else x.shape


def fp8_sites(block: nn.Module, paths: Iterable[str]) -> List[Tuple[nn.Module, str, nn.Module]]:
    """(parent, name, linear) of each path in ``block`` (a ``ModuleList``'s child "0" is an
    attribute too, so getattr / setattr take every one)."""
    sites = []
    for path in paths:
        parent_path, _, name = path.rpartition(".")
        parent = block.get_submodule(parent_path)
        sites.append((parent, name, getattr(parent, name)))
    return sites


def fp8_problems(transformer: nn.Module, blocks: Iterable[nn.Module], paths: Iterable[str],
                 ff: Optional[str]) -> List[str]:
    """Why fp8=True cannot convert a block: its feed-forward (attribute ``ff``; None: no FeedForward
    to check) must be diffusers' ``FeedForward`` with GELU-tanh (its FP8 GELU is ``gelu_tanh_fp8``),
    and every block linear a plain CUDA half-precision ``nn.Linear`` without offload hooks, its dims
    multiples of 16 (``torch._scaled_mm``)."""
    named = {id(m): name for name, m in transformer.named_modules()}
    blocks = list(blocks)
    # the feed-forwards first: a wrong one is the model's shape, the linears' problems are often a move away
    problems = [f"{named.get(id(getattr(block, ff)), ff)} is not diffusers' FeedForward with GELU-tanh, which "
                "fp8=True runs as gelu_tanh_fp8" for block in blocks if ff and tanh_gelu_of(getattr(block, ff)) is None]
    for block in blocks:
        for _, _, linear in fp8_sites(block, paths):
            where = named.get(id(linear), "a block linear")
            if type(linear) is not nn.Linear:
                problems.append(f"{where} is a {type(linear).__name__}, not a plain nn.Linear (LoRA or quantisation "
                                "wrappers keep their own forward)")
            elif weights_managed_by_hooks(linear):
                problems.append(f"{where} has offload or casting hooks")
            elif linear.weight.device.type != "cuda":
                problems.append(f"{where} is on {linear.weight.device}; move the model to the GPU first")
            elif linear.weight.dtype not in (torch.bfloat16, torch.float16):
                problems.append(f"{where} is {linear.weight.dtype}; fp8=True runs a bfloat16 or float16 model (its "
                                "norms write e4m3 rows from half-precision activations)")
            elif linear.in_features % 16 or linear.out_features % 16:
                problems.append(f"{where} is {linear.in_features} -> {linear.out_features}; FP8 GEMMs need "
                                "multiples of 16")
    return problems


def fused_projection_problems(transformer: nn.Module, attentions: Iterable[nn.Module]) -> List[str]:
    """The attentions with fused q/k/v projections (``fuse_projections``): their processors call
    ``to_qkv``, so fp8=True's ``Fp8Linear`` q/k/v would not run."""
    named = {id(m): name for name, m in transformer.named_modules()}
    return [f"{named.get(id(attn), 'an attention')} has fused projections (fuse_projections); unfuse them for "
            "fp8=True" for attn in attentions if getattr(attn, "fused_projections", False)]


def swap_fp8(blocks: Iterable[nn.Module], paths: Iterable[str], kernel, fast_accum: bool,
             keep_bf16: bool = True) -> List[SwappedLinear]:
    """Each block linear of ``paths`` as the kernel's ``Fp8Linear``. With ``keep_bf16`` the originals
    are returned for :func:`unswap_fp8` (they stay in memory); without, they are dropped (None): the
    bf16 weights are freed once nothing else holds them, and restore refuses."""
    swapped = []
    for block in blocks:
        for parent, name, linear in fp8_sites(block, paths):
            fp8 = kernel.Fp8Linear.from_linear(linear, fast_accum=fast_accum)
            setattr(parent, name, fp8)
            swapped.append((parent, name, linear if keep_bf16 else None, fp8))
    return swapped


def check_fp8_restorable(swapped: Iterable[SwappedLinear]) -> None:
    """RuntimeError (nothing changed) where ``fp8_keep_bf16=False`` dropped the bf16 linears."""
    if any(original is None for _, _, original, _ in swapped):
        raise RuntimeError("ltx_kernels_diffusers: optimize(..., fp8=True, fp8_keep_bf16=False) freed the bf16 "
                           "weights of the FP8 linears, so restore cannot give the stock model back; nothing was "
                           "changed. Load the model again for the stock one.")


def fp8_replaced(swapped: Iterable[SwappedLinear]) -> List[nn.Module]:
    """The Fp8Linears no longer in place (replaced since :func:`swap_fp8`)."""
    return [fp8 for parent, name, _, fp8 in swapped if getattr(parent, name) is not fp8]


def unswap_fp8(swapped: Iterable[SwappedLinear]) -> None:
    for parent, name, original, _ in reversed(list(swapped)):
        setattr(parent, name, original)


@dataclass
class HookedState:
    """What a hook-based ``apply`` changed, for :func:`restore_hooked`."""

    kernel: object
    options: object
    hooks: List[InstalledHook] = field(default_factory=list)
    processors: List[Tuple[nn.Module, object, object]] = field(default_factory=list)  # (attn, original, ours)
    linears: List[SwappedLinear] = field(default_factory=list)  # fp8=True
    set_repeated_blocks: bool = False  # apply set ``_repeated_blocks`` on the instance

    def __deepcopy__(self, memo):
        # diffusers' hook chains are closures over the original modules: a deep copy would run them.
        raise TypeError("ltx_kernels_diffusers: a transformer optimised with diffusers hooks cannot be deep-copied "
                        "(the copy's hooks would run the original's modules); restore it, copy it, then optimize "
                        "each")


_BACKEND_ATTRIBUTES = ("_attention_backend", "_parallel_config")


def _carry_backend(source, target) -> None:
    """An attention backend (or parallel config) set on ``source`` goes to ``target``, where it has the attribute."""
    for name in _BACKEND_ATTRIBUTES:
        if hasattr(target, name) and getattr(source, name, None) is not getattr(target, name):
            setattr(target, name, getattr(source, name, None))


def _set_processor(attn: nn.Module, processor) -> None:
    if hasattr(attn, "set_processor"):
        attn.set_processor(processor)
    else:
        attn.processor = processor  # MochiAttention has no set_processor


def install_processor(state: HookedState, attn: nn.Module, fused) -> None:
    """Give ``attn`` the processor ``fused``, with the backend of the one it replaces."""
    original = attn.processor
    _carry_backend(original, fused)
    state.processors.append((attn, original, fused))
    _set_processor(attn, fused)


def restore_hooked(transformer: nn.Module, state: HookedState) -> None:
    """Remove our hooks (hooks added after them stay, unwrapped from ours) and put
    back the original processors, with an attention backend chosen meanwhile;
    HooksPresentError, changing nothing, when an accelerate hook now wraps a
    module we hooked or a processor was replaced."""
    names = {id(m): name for name, m in transformer.named_modules()}
    wrapped = [names.get(id(h.module)) for h in state.hooks if h.present and hooked_by_accelerate(h.module)]
    wrapped += [names.get(id(attn)) for attn, _, fused in state.processors if attn.processor is not fused]
    check_fp8_restorable(state.linears)
    wrapped += ["an FP8 linear" for _ in fp8_replaced(state.linears)]
    if wrapped:
        raise HooksPresentError(
            f"ltx_kernels_diffusers: restore found {', '.join(sorted(set(wrapped))[:4])} wrapped by accelerate hooks "
            "or given another attention processor (or module) after optimize; nothing was changed. Remove those "
            "first (for a pipeline: pipe.remove_all_hooks()), call restore, then add them again.")
    for installed in reversed(state.hooks):
        uninstall(installed)
    unswap_fp8(state.linears)
    for attn, original, fused in state.processors:
        _carry_backend(fused, original)
        _set_processor(attn, original)
    if state.set_repeated_blocks:
        transformer.__dict__.pop("_repeated_blocks", None)
    invalidate_registry_caches(transformer)


__all__ = ["check_kernel_functions", "make_options", "plain", "transformer_problems", "linear_gelu_tanh",
           "gelu_forward", "tanh_gelu_of", "HookedState", "fp8_sites", "fp8_problems", "fused_projection_problems",
           "swap_fp8", "fp8_replaced",
           "unswap_fp8", "check_fp8_restorable",
           "install_processor", "restore_hooked"]
