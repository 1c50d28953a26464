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
"""

from __future__ import annotations

from dataclasses import fields
from typing import Dict, Iterable, Mapping


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


__all__ = ["check_kernel_functions", "make_options"]
