"""``optimize(..., cuda_graph=True)``: the transformer's whole forward replayed from one CUDA graph.

With the kernels fused, a step of a small model is bound by the host, not the GPU: LTX-Video 2B's
FP8 step enqueues about 830 kernels, and regional compile's guards and wrappers cost the host more
than the GPU takes to run them (docs/fp8.md). A CUDA graph launches them all at once. The first call
with a new input signature warms the forward up twice on a side stream (compiling, if the blocks are
compiled), then captures it; later calls copy their tensors into the captured inputs, replay, and
return clones of the outputs, so nothing a caller holds is overwritten by the next step.

It runs the captured forward only where a replay is the forward the caller asked for:

- inference only: under grad mode, while torch.compile traces the model, or under context
  parallelism, the forward runs as it is;
- every tensor input on the GPU, every other input hashable; the graph is chosen by the inputs'
  shapes, dtypes and other values (at most ``MAX_GRAPHS``, the least recently used dropped first);
- the model as captured: new or replaced modules, parameters or buffers (a LoRA loaded or unloaded),
  moved weights (``enable_model_cpu_offload`` moving the model), a different attention processor or
  backend, or peft adapters switched or rescaled drop every graph, and the next call captures again;
  with another library's hooks below the transformer (group offloading, sequential CPU offload,
  caches) the forward runs as it is: they move weights or decide on the host inside it.

A forward that cannot be captured (one that synchronises with the host: the last warm-up call runs
under ``torch.cuda.set_sync_debug_mode("error")`` to find out before capturing) runs as it is, after one
``CudaGraphWarning`` saying why; so does any call the rules above send past the graph. What it
cannot see is a change the forward reads from Python state outside those (an attribute of a module
set by hand): call :func:`reset_cuda_graphs` after one.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import List, Optional, Tuple

import torch
from diffusers.hooks import ModelHook
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from .discovery import foreign_hook_names
from .hooks import HOOK_PREFIX

MAX_GRAPHS = 4  # input signatures kept per model: CFG on and off, two resolutions
WARMUP_CALLS = 2  # before a capture, outside it: compilation, autotuning and cuDNN plans happen in the first
SEAM = "cuda_graph"


class CudaGraphWarning(UserWarning):
    """``optimize(..., cuda_graph=True)`` ran a call of the forward without its CUDA graph, and why."""


_generation = 0  # bumped whenever any module registers a submodule, parameter or buffer
_registration_hooks: list = []


def _bump(*_args) -> None:
    global _generation
    _generation += 1


def _watch_registrations() -> None:
    if not _registration_hooks:
        module = torch.nn.modules.module
        _registration_hooks.extend(register(_bump) for register in (
            module.register_module_module_registration_hook, module.register_module_parameter_registration_hook,
            module.register_module_buffer_registration_hook))


class _Captured:
    __slots__ = ("graph", "inputs", "outputs", "out_spec")

    def __init__(self, graph, inputs, outputs):
        self.graph, self.inputs = graph, inputs
        self.outputs, self.out_spec = tree_flatten(outputs)  # flattened once, not at every replay


class CudaGraphHook(ModelHook):
    """The transformer's forward through :class:`_Captured` graphs (module docstring)."""

    def __init__(self):
        super().__init__()
        _watch_registrations()
        self.graphs: "OrderedDict[tuple, _Captured]" = OrderedDict()
        self.pool = None
        self.refused: dict = {}  # signature -> why its capture failed
        self.warned: set = set()
        self.generation = -1
        self.structure: Optional[tuple] = None
        self.tensors: List[torch.Tensor] = []
        self.pointers: Tuple[int, ...] = ()
        self.attentions: List[nn.Module] = []
        self.adapters: List[nn.Module] = []
        self.state: Optional[tuple] = None
        self.foreign_hooks: Optional[str] = None

    def reset(self) -> None:
        """Drop every graph (the next call captures again)."""
        self.graphs.clear()
        self.refused.clear()
        self.pool = None

    def new_forward(self, module: nn.Module, *args, **kwargs):
        forward = self.fn_ref.original_forward
        if torch.compiler.is_compiling() or torch.is_grad_enabled():
            return forward(*args, **kwargs)
        if getattr(module, "_parallel_config", None) is not None:
            return self._uncaptured(forward, args, kwargs, "context parallelism runs collectives in the forward")
        leaves, spec = tree_flatten((args, kwargs))
        signature, why = self._signature(leaves, spec)
        if why is None:
            why = self._check_model(module)
        if why is None:
            why = self.refused.get(signature)
        if why is not None:
            return self._uncaptured(forward, args, kwargs, why)
        captured = self.graphs.get(signature)
        if captured is None:
            captured = self._capture(forward, leaves, spec, signature)
            if captured is None:
                return self._uncaptured(forward, args, kwargs, self.refused[signature])
        self.graphs.move_to_end(signature)
        for static, x in zip(captured.inputs, (x for x in leaves if isinstance(x, torch.Tensor))):
            static.copy_(x)
        captured.graph.replay()
        return tree_unflatten([x.clone() if isinstance(x, torch.Tensor) else x for x in captured.outputs],
                              captured.out_spec)

    def _uncaptured(self, forward, args, kwargs, why: str):
        if why not in self.warned:
            self.warned.add(why)
            warnings.warn(f"ltx_kernels_diffusers: cuda_graph=True ran the forward without its CUDA graph: {why}",
                          CudaGraphWarning, stacklevel=6)  # the model's caller
        return forward(*args, **kwargs)

    @staticmethod
    def _signature(leaves, spec):
        """The graph's key, or (None, why no graph can serve these inputs)."""
        # inference mode too: its captured inputs could not be written outside it
        key = [spec, torch.is_inference_mode_enabled(), torch.is_autocast_enabled("cuda"),
               torch.get_autocast_dtype("cuda")]
        for x in leaves:
            if isinstance(x, torch.Tensor):
                if not x.is_cuda:
                    return None, f"an input tensor is on {x.device} (a graph reads only GPU inputs)"
                key.append((x.shape, x.dtype, x.device))
            else:
                try:
                    hash(x)
                except TypeError:
                    return None, f"an input ({type(x).__name__}) is not hashable"
                key.append((type(x), x))
        return tuple(key), None

    def _check_model(self, module: nn.Module) -> Optional[str]:
        """Drop the graphs when the model is not the one they captured; why no graph can run, or None."""
        if self.generation != _generation:
            self.generation = _generation
            structure = tuple(map(id, module.modules())) + tuple(map(id, module.parameters())) + tuple(
                map(id, module.buffers()))
            if structure != self.structure:
                self.structure = structure
                self.tensors = [*module.parameters(), *module.buffers()]
                self.attentions = [m for m in module.modules() if hasattr(m, "processor")]
                self.adapters = [m for m in module.modules() if hasattr(m, "active_adapters") and hasattr(m, "scaling")]
                hooked = [name for name, m in module.named_modules() if name and (
                    hasattr(m, "_hf_hook") or foreign_hook_names(m))]
                self.foreign_hooks = (f"hooks of another library on {hooked[0]} (offloading, caching) run inside "
                                      "the forward" if hooked else None)
                self.reset()
        pointers = tuple(t.data_ptr() for t in self.tensors)
        state = (tuple((id(m.processor), getattr(m.processor, "_attention_backend", None)) for m in self.attentions),
                 tuple((tuple(m.active_adapters), tuple(sorted(m.scaling.items())),
                        getattr(m, "disable_adapters", False), getattr(m, "merged", False)) for m in self.adapters))
        if pointers != self.pointers or state != self.state:
            self.pointers, self.state = pointers, state
            self.reset()
        return self.foreign_hooks

    def _capture(self, forward, leaves, spec, signature) -> Optional[_Captured]:
        inputs = [x.clone() for x in leaves if isinstance(x, torch.Tensor)]
        it = iter(inputs)
        args, kwargs = tree_unflatten([next(it) if isinstance(x, torch.Tensor) else x for x in leaves], spec)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(side):
                for _ in range(WARMUP_CALLS - 1):
                    forward(*args, **kwargs)
                synchronises = _synchronises(forward, args, kwargs)
            torch.cuda.current_stream().wait_stream(side)
            if synchronises:
                self.refused[signature] = f"the forward synchronises with the host ({synchronises})"
                return None
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = forward(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any capture failure: the forward runs as it is, said once
            torch.cuda.synchronize()
            self.refused[signature] = f"its capture failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
            return None
        self.pool = graph.pool()
        if len(self.graphs) >= MAX_GRAPHS:
            self.graphs.popitem(last=False)
        self.graphs[signature] = captured = _Captured(graph, inputs, outputs)
        return captured


def _synchronises(forward, args, kwargs) -> Optional[str]:
    """Run ``forward`` once; where it synchronises with the host, what did (and it stops there). A capture
    that fails leaves CUDA's random generator unusable in torch 2.11, so this finds out first."""
    mode = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        forward(*args, **kwargs)
    except RuntimeError as e:
        return str(e).splitlines()[0][:160]
    finally:
        torch.cuda.set_sync_debug_mode(mode)
    return None


def cuda_graph_hook(transformer: nn.Module) -> Optional[CudaGraphHook]:
    """The :class:`CudaGraphHook` on ``transformer`` (``optimize(..., cuda_graph=True)``), or None."""
    registry = getattr(transformer, "_diffusers_hook", None)
    hook = registry.get_hook(HOOK_PREFIX + SEAM) if registry is not None else None
    return hook if isinstance(hook, CudaGraphHook) else None


def reset_cuda_graphs(target) -> None:
    """Drop the CUDA graphs ``optimize(..., cuda_graph=True)`` captured on a pipeline's transformer (or the
    transformer), after a change they cannot see (module docstring); the next call captures again. A no-op
    without them."""
    model = target if isinstance(target, nn.Module) else getattr(target, "transformer", None)
    model = getattr(model, "_orig_mod", model)  # torch.compile(model)'s wrapper
    hook = cuda_graph_hook(model) if isinstance(model, nn.Module) else None
    if hook is not None:
        hook.reset()


__all__ = ["CudaGraphHook", "CudaGraphWarning", "cuda_graph_hook", "reset_cuda_graphs", "MAX_GRAPHS", "SEAM"]
