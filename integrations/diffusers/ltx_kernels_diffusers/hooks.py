"""Fused forwards installed as diffusers hooks (``diffusers.hooks.ModelHook`` on a
module's ``HookRegistry``), the seam diffusers itself uses for group offloading,
layerwise casting and the block caches.

A :class:`FusedForwardHook` is registered first, so it is the innermost hook of
its module: hooks added afterwards (group offloading, first-block cache,
layerwise casting) wrap it and call it as they would call the stock forward,
and ``HookRegistry.remove_hook`` takes it out of the chain without disturbing
them. Hooks of ours carry names starting with :data:`HOOK_PREFIX`, so the checks
for other hooks (``discovery.hooked_modules``) can tell them apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.models.attention import FeedForward
from torch import nn


HOOK_PREFIX = "ltx_kernels_diffusers."


class FusedForwardHook(ModelHook):
    """Runs ``fused(module, *args, **kwargs)`` instead of the forward it wraps,
    under autograd too (its ops come from ``autograd.AutogradKernel``)."""

    def __init__(self, fused: Callable):
        super().__init__()
        self.fused = fused

    def new_forward(self, module: nn.Module, *args, **kwargs):
        return self.fused(module, *args, **kwargs)


@dataclass
class InstalledHook:
    """One hook of ours on one module, and what to tidy away when it goes."""

    module: nn.Module
    name: str
    created_registry: bool  # the module had no HookRegistry before
    had_forward: bool       # the module already had an instance `forward` before

    @property
    def present(self) -> bool:
        registry = getattr(self.module, "_diffusers_hook", None)
        return registry is not None and self.name in registry.hooks


def install(module: nn.Module, seam: str, fused: Callable) -> InstalledHook:
    """Register ``fused`` as the forward of ``module`` (hook name ``HOOK_PREFIX + seam``)."""
    return install_hook(module, seam, FusedForwardHook(fused))


def install_hook(module: nn.Module, seam: str, hook: ModelHook) -> InstalledHook:
    """Register ``hook`` (any ``ModelHook``) on ``module`` as ours (hook name ``HOOK_PREFIX + seam``)."""
    installed = InstalledHook(module, HOOK_PREFIX + seam, created_registry=not hasattr(module, "_diffusers_hook"),
                              had_forward="forward" in module.__dict__)
    HookRegistry.check_if_exists_or_initialize(module).register_hook(hook, installed.name)
    return installed


def uninstall(installed: InstalledHook) -> None:
    """Take the hook out of its module's chain; a registry (and the instance
    ``forward`` it left) that only our hook needed is removed too."""
    module = installed.module
    if not installed.present:
        return
    registry = module._diffusers_hook
    registry.remove_hook(installed.name, recurse=False)
    if installed.created_registry and not registry.hooks:
        del module._diffusers_hook
        if not installed.had_forward:
            module.__dict__.pop("forward", None)  # remove_hook leaves the bound class forward on the instance


def call(module: nn.Module, *args, **kwargs):
    """Call ``module`` from a fused block forward. Where our hook is all that wraps
    it (no other diffusers hook, no accelerate hook, no torch forward hook), run our
    fused forward directly: called through the module, torch 2.11's dynamo guards on
    the identity of the module's hooked ``forward`` (a functools.partial per
    instance), so ``compile_repeated_blocks`` recompiled for every block and a
    fullgraph compile of a model deeper than dynamo's recompile limit (8) failed."""
    registry = module.__dict__.get("_diffusers_hook")
    if (registry is not None and len(registry.hooks) == 1 and not hooked_by_accelerate(module)
            and not (module._forward_hooks or module._forward_pre_hooks)):
        hook = next(iter(registry.hooks.values()))
        if isinstance(hook, FusedForwardHook):
            return hook.fused(module, *args, **kwargs)
    return module(*args, **kwargs)


def feed_forward(ff: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """``ff(hidden_states)`` for diffusers' ``FeedForward`` (its forward runs ``net``
    in order), its layers through :func:`call`; any other module, or one with hooks
    of its own, is called as it is."""
    if (type(ff) is not FeedForward or "_diffusers_hook" in ff.__dict__ or hooked_by_accelerate(ff)
            or ff._forward_hooks or ff._forward_pre_hooks):
        return ff(hidden_states)
    for layer in ff.net:
        hidden_states = call(layer, hidden_states)
    return hidden_states


def hooked_by_accelerate(module: nn.Module) -> bool:
    """accelerate's hooks (``_hf_hook``) replace ``forward`` on the instance and keep
    the one before in ``_old_forward``: removing a diffusers hook under them
    would silently drop them."""
    return hasattr(module, "_hf_hook")


def weights_managed_by_hooks(module: nn.Module) -> bool:
    """Offload or casting hooks (accelerate's ``_hf_hook``; diffusers' group
    offloading or layerwise casting) keep the weights in place only while the
    module runs: call it, do not read its weight."""
    registry = getattr(module, "_diffusers_hook", None)
    return hooked_by_accelerate(module) or (registry is not None and bool(registry.hooks))


def invalidate_registry_caches(root: nn.Module) -> None:
    """diffusers caches, per registry, the registries below it (``cache_context``);
    adding or removing hooks below makes that list stale."""
    registry: Optional[HookRegistry] = getattr(root, "_diffusers_hook", None)
    if registry is not None and hasattr(registry, "invalidate_child_registries_cache"):
        registry.invalidate_child_registries_cache()


__all__ = ["HOOK_PREFIX", "FusedForwardHook", "InstalledHook", "install", "install_hook", "uninstall", "call",
           "feed_forward",
           "hooked_by_accelerate", "weights_managed_by_hooks", "invalidate_registry_caches"]
