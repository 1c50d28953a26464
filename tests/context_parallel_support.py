"""Workers for tests/test_integration_context_parallel_{cpu,gpu}.py. :func:`on_rank` is what each spawned
process runs: it joins the process group (gloo on the CPU, NCCL with rank r on GPU r), runs a worker and
puts rank 0's result (or its traceback, as ("error", text)) on a queue."""

from __future__ import annotations

import os
import traceback

import torch
import torch.distributed as dist


def on_rank(rank: int, world: int, port: int, repo_id: str, version: int, worker, args: tuple, queue,
            gpu: bool = False) -> None:
    """``worker(world, kernel_factory, *args)`` on this rank of a group of ``world`` processes: gloo with
    the reference ops (``ReferenceKernel``) on the CPU, or NCCL with the built kernel on GPU ``rank``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if gpu:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        # diffusers' enable_parallelism places rank r on accelerator r % device_count: with no GPU there is
        # none, so count the CPU as one device (the mesh is then a CPU mesh over gloo)
        torch.accelerator.device_count = lambda: 1
    try:
        result = worker(world, lambda: _kernel(repo_id, version, reference=not gpu), *args)
    except Exception:  # noqa: BLE001 - the test reports it
        result = ("error", traceback.format_exc())
    finally:
        dist.destroy_process_group()
    if rank == 0:
        queue.put(result)


def _raised(call):
    """(the type name and message of what ``call()`` raises), or None where it returns."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the test checks which
        return type(e).__name__, str(e)
    return None


def _kernel(repo_id: str, version: int, reference: bool = True):
    import kernels

    from .integration_support import ReferenceKernel

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    kernel = kernels.get_kernel(repo_id, version=version, trust_remote_code=True)
    return ReferenceKernel(kernel) if reference else kernel


def _model_and_inputs(name: str, text_masks: bool = False):
    """A tiny model of ``name``, its forward's keyword arguments (sequences of even length, so two ranks
    split them), and optimize's options. ``text_masks`` (LTX-2): its padded text masks kept."""
    from . import integration_support as s

    if name == "ltx":
        model = s.tiny_model()
        kwargs = s.ltx_inputs(model, batch=2, frames=2, height=4, width=4, text=6)
        # diffusers 0.42.1's Ulysses on the native backend fails on LTX-Video's text mask in stock too: the
        # mask keeps every head while each rank holds half of them
        kwargs["encoder_attention_mask"] = None
        return model, kwargs, dict(gelu_epilogue=False)
    if name == "wan":
        model = s.tiny_wan()
        return model, s.wan_inputs(model, batch=2, frames=2, height=4, width=6, text=8), {}
    if name == "flux":
        model = s.tiny_flux()
        return model, s.flux_inputs(model, batch=2, height=4, width=4, text=6), {}
    if name == "ltx2":
        model = s.tiny_ltx2()
        kwargs = s.ltx2_inputs(model, batch=2, frames=2, height=4, width=4, audio=8, text=6)
        return model, kwargs if text_masks else without_masks(kwargs), {}
    raise ValueError(name)


def without_masks(kwargs: dict) -> dict:
    """The text masks left out: with one, Ulysses on the native backend fails in diffusers 0.42.1 (stock
    too: the mask keeps every head while each rank holds half)."""
    return {k: None if k.endswith("attention_mask") else v for k, v in kwargs.items()}


def outputs(out) -> torch.Tensor:
    """Every output tensor of a forward (LTX-2: video and audio), flattened into one."""
    return torch.cat([t.flatten() for t in out if isinstance(t, torch.Tensor)])


def parallel_config(model, **degrees):
    """``enable_parallelism``'s keyword arguments: the config, and our plan where diffusers' own does not run."""
    from diffusers import ContextParallelConfig

    from ltx_kernels_diffusers import context_parallel_plan

    return dict(config=ContextParallelConfig(**degrees), cp_plan=context_parallel_plan(model))


def ulysses_against_one_process(world: int, kernel, name: str, ours: bool, text_masks: bool = False):
    """Model ``name`` (optimised where ``ours``; ``text_masks``: see :func:`_model_and_inputs`) run in this
    process, then with Ulysses context parallelism over the group: (relative L2 between the two outputs,
    whether their shapes agree, the all-to-alls counted, the last block's token counts: one process, then
    this rank)."""
    from diffusers.models import attention_dispatch

    from ltx_kernels_diffusers import optimize

    model, kwargs, options = _model_and_inputs(name, text_masks)
    if ours:
        optimize(model, kernel=kernel(), **options)
    # that parallelism really ran: the all-to-alls around attention, and the last block's tokens
    exchanges, block_tokens = [0], []
    blocks = getattr(model, "transformer_blocks", None) or model.blocks
    blocks[-1].register_forward_pre_hook(  # the last: diffusers may split at the first block's own forward
        lambda module, args, kw: block_tokens.append((args[0] if args else kw["hidden_states"]).shape[1]),
        with_kwargs=True)
    all_to_all = attention_dispatch._all_to_all_single

    def counted(x, group):
        exchanges[0] += 1
        return all_to_all(x, group)

    attention_dispatch._all_to_all_single = counted
    with torch.no_grad():
        single = outputs(model(**kwargs))
        model.enable_parallelism(**parallel_config(model, ulysses_degree=world))
        parallel = outputs(model(**kwargs))
    return float((parallel - single).norm() / single.norm()), parallel.shape == single.shape, exchanges[0], block_tokens


def _optimised_under_ulysses(world: int, kernel, name: str):
    """Tiny model ``name``, optimised, then under Ulysses over the group; with its forward's arguments."""
    from ltx_kernels_diffusers import optimize

    model, kwargs, options = _model_and_inputs(name)
    optimize(model, kernel=kernel(), **options)
    model.enable_parallelism(**parallel_config(model, ulysses_degree=world))
    return model, kwargs


def forward_with_grads(world: int, kernel, name: str):
    """Model ``name``, optimised, under Ulysses with ``context_parallel_plan``, run with its video stream
    requiring grad: the error's type name and message, or ("no error", "")."""
    model, kwargs = _optimised_under_ulysses(world, kernel, name)
    video = kwargs["hidden_states"].detach().requires_grad_()
    return _raised(lambda: model(**{**kwargs, "hidden_states": video})) or ("no error", "")


def blocks_compiled_fullgraph(world: int, kernel, name: str):
    """Model ``name``, optimised, under Ulysses with every block compiled (``fullgraph=True``, aot_eager):
    "ran" where it runs, else the error (a graph break names the function dynamo skipped)."""
    model, kwargs = _optimised_under_ulysses(world, kernel, name)
    blocks = model.transformer_blocks
    for i, block in enumerate(blocks):
        blocks[i] = torch.compile(block, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        raised = _raised(lambda: model(**kwargs))
    return "ran" if raised is None else f"{raised[0]}: {raised[1][:600]}"


def optimize_after_parallelism(world: int, kernel):
    """enable_parallelism, then optimize: the error's type name and message."""
    from diffusers import ContextParallelConfig

    from ltx_kernels_diffusers import optimize

    model, _, options = _model_and_inputs("ltx")
    model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
    return _raised(lambda: optimize(model, kernel=kernel(), **options)) or ("no error", "")


def restore_under_parallelism(world: int, kernel, name: str):
    """optimize, enable_parallelism, then restore: (relative L2 of the restored model's parallel output
    to the stock model's one-process output, whether it is still optimised), or the error's type name
    and message."""
    from diffusers import ContextParallelConfig

    from ltx_kernels_diffusers import is_optimized, optimize, restore

    model, kwargs, options = _model_and_inputs(name)
    with torch.no_grad():
        stock = model(**kwargs)[0]
        optimize(model, kernel=kernel(), **options)
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
        model(**kwargs)
        refused = _raised(lambda: restore(model))
        if refused:
            return refused
        restored = model(**kwargs)[0]
    return float((restored - stock).norm() / stock.norm()), is_optimized(model)


# --- on GPUs (NCCL) -----------------------------------------------------------------------------------

def _gpu_model_and_inputs(name: str):
    """Model ``name`` at its real width and a reduced depth, bf16 on this rank's GPU, its forward's keyword
    arguments (token counts even) and optimize's options."""
    from . import integration_support as s
    from .test_integration_flux_gpu import IMAGE, bf16_model as flux_bf16
    from .test_integration_gpu import ltx_model
    from .test_integration_wan_gpu import bf16_model as wan_bf16, inputs_for as wan_inputs_for

    if name == "ltx":
        model = ltx_model(torch.bfloat16, num_layers=2)
        kwargs = s.ltx_inputs(model, **s.LTX_2B_VIDEO)
        kwargs["encoder_attention_mask"] = None  # stock Ulysses fails on LTX-Video's text mask (CPU tests)
        return model, kwargs, {}
    if name == "wan":
        model = wan_bf16(num_layers=2)
        return model, wan_inputs_for(model), {}
    if name == "flux":
        model = flux_bf16()
        return model, s.flux_inputs(model, **IMAGE), {}
    if name == "ltx2":
        from .test_integration_ltx2_gpu import VIDEO as LTX2_VIDEO, bf16_model as ltx2_bf16

        model = ltx2_bf16("2.0", num_layers=2)
        return model, without_masks(s.ltx2_inputs(model, **LTX2_VIDEO)), {}
    raise ValueError(name)


def parallel_against_one_gpu(world: int, kernel, name: str, mode: str):
    """Stock and optimised model ``name``, each run on this GPU and then under context parallelism
    (``mode``: "ulysses" on the native backend, or "ring" on diffusers' ``_native_cudnn`` backend, which
    returns the LSE ring attention needs) over the group. Returns the relative L2 of each one's parallel
    output to its one-GPU output (stock, ours), and of ours to stock on one GPU."""
    import copy

    from ltx_kernels_diffusers import optimize

    from .integration_support import rel_l2

    stock, kwargs, options = _gpu_model_and_inputs(name)
    ours = copy.deepcopy(stock)
    optimize(ours, kernel=kernel(), **options)
    results = {}
    with torch.no_grad():
        for label, model in (("stock", stock), ("ours", ours)):
            if mode == "ring":
                model.set_attention_backend("_native_cudnn")
            single = outputs(model(**kwargs))
            model.enable_parallelism(**parallel_config(model, **{f"{mode}_degree": world}))
            results[label] = single, outputs(model(**kwargs))
    (stock_single, stock_parallel), (ours_single, ours_parallel) = results["stock"], results["ours"]
    return rel_l2(stock_parallel, stock_single), rel_l2(ours_parallel, ours_single), rel_l2(ours_single, stock_single)
