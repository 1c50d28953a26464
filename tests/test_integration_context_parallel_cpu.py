"""Context parallelism (issue 38) without a GPU: two gloo processes run diffusers'
``enable_parallelism`` (Ulysses) on tiny LTX-Video, Wan, Flux and LTX-2 models (LTX-2 with
``context_parallel_plan``'s plan: diffusers' own fails there). An optimised model gives the
output it gives in one process, as the stock model does; optimize after enable_parallelism
is refused, saying which order works. (The GPU tests, ring attention and scaling are
issue 38's GPU work.)"""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytest.importorskip("diffusers")

from . import context_parallel_support as support  # noqa: E402
from .conftest import BUILD_TOML, REPO_ID  # noqa: E402

pytestmark = [pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                 reason="needs torch.distributed with gloo"),
              # diffusers builds the mesh on the accelerator where there is one (then NCCL, not this CPU form)
              pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU form: a GPU machine takes the GPU tests")]
WORLD = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(worker, *args):
    context = mp.get_context("spawn")
    queue = context.Queue()
    mp.start_processes(support.on_rank, args=(WORLD, free_port(), REPO_ID, BUILD_TOML["general"]["version"], worker,
                                              args, queue), nprocs=WORLD, start_method="spawn", join=True)
    result = queue.get(timeout=60)
    assert result[0] != "error", result[1]
    return result


@pytest.mark.parametrize("ours", [False, True], ids=["stock", "optimized"])
@pytest.mark.parametrize("model", ["ltx", "wan", "flux", "ltx2"])
def test_ulysses_parallelism_gives_the_one_process_output(kernel, model, ours):
    rel, same_shape, exchanges, (tokens, rank_tokens) = run_workers(support.ulysses_against_one_process, model,
                                                                    ours)
    assert same_shape  # proj_out's output gathered again
    assert exchanges > 0 and rank_tokens * WORLD == tokens  # parallel: each rank held half the tokens
    assert rel <= 1e-6, rel  # float32 on the CPU: each rank attends over the whole sequence for its heads


def test_optimize_after_enable_parallelism_says_to_optimize_first(kernel):
    name, message = run_workers(support.optimize_after_parallelism)
    assert name == "HooksPresentError"
    assert "enable_parallelism" in message and "optimize first" in message


@pytest.mark.parametrize("model", ["wan", "flux"])
def test_restore_under_parallelism_gives_the_stock_model(kernel, model):
    """Wan and Flux are optimised through hooks, which restore takes out from under diffusers' own."""
    rel, optimized = run_workers(support.restore_under_parallelism, model)
    assert not optimized and rel <= 1e-6, rel


def test_restore_of_ltx_video_under_parallelism_says_it_cannot(kernel):
    """LTX-Video's fused forwards are what the context-parallel hooks wrap: restore refuses, saying so."""
    name, message = run_workers(support.restore_under_parallelism, "ltx")
    assert name == "HooksPresentError" and "enable_parallelism" in message and "nothing was changed" in message


def test_ltx2_context_parallel_plan_splits_every_stream_and_rope_table():
    from ltx_kernels_diffusers import context_parallel_plan

    from .integration_support import tiny_ltx2, tiny_wan

    plan = context_parallel_plan(tiny_ltx2())
    assert set(plan[""]) == {"hidden_states", "audio_hidden_states", "encoder_hidden_states",
                             "audio_encoder_hidden_states"}
    assert {"rope", "audio_rope", "cross_attn_rope", "cross_attn_audio_rope", "proj_out", "audio_proj_out"} <= set(plan)
    assert plan["rope"][0].split_dim == 1 and context_parallel_plan(tiny_ltx2(rope_type="split"))["rope"][0].split_dim == 2
    assert context_parallel_plan(tiny_wan()) is None  # diffusers' own


def test_ltx2_context_parallel_plan_splits_only_the_video_of_an_optimised_model(kernel):
    from ltx_kernels_diffusers import context_parallel_plan, optimize

    from .integration_support import ReferenceKernel, tiny_ltx2

    model = tiny_ltx2()
    optimize(model, kernel=ReferenceKernel(kernel))
    plan = context_parallel_plan(model)
    assert set(plan[""]) == {"hidden_states"} and set(plan) == {"", "rope", "cross_attn_rope", "proj_out"}
    block = model.transformer_blocks[0]
    modes = {name: getattr(block, name).processor.cp_mode for name in
             ("attn1", "attn2", "audio_attn1", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")}
    assert modes == {"attn1": "sequence", "attn2": "local", "audio_attn1": "local", "audio_attn2": "local",
                     "audio_to_video_attn": "local", "video_to_audio_attn": "gather"}


def test_optimised_ltx2_exchanges_only_around_video_self_attention_masks_and_all(kernel):
    """One of a block's six attentions all-to-alls (v2a gathers instead); the padded text masks (which
    stock Ulysses cannot take) work, since every rank holds the whole text and its mask."""
    *_, stock_exchanges, _ = run_workers(support.ulysses_against_one_process, "ltx2", False)
    rel, same_shape, exchanges, (tokens, rank_tokens) = run_workers(support.ulysses_against_one_process, "ltx2",
                                                                    True, True)
    assert same_shape and rank_tokens * WORLD == tokens
    assert 6 * exchanges == stock_exchanges, (exchanges, stock_exchanges)
    assert rel <= 1e-6, rel


def test_optimised_ltx2_blocks_compile_fullgraph_under_ulysses(kernel):
    """The exchanges our LTX-2 processors make themselves (v2a's all-gather) trace without a graph break."""
    assert run_workers(support.blocks_compiled_fullgraph, "ltx2") == "ran"


def test_optimised_ltx2_under_its_plan_refuses_to_carry_grads(kernel):
    """Text and audio whole on every rank would give partial or repeated gradients: the forward raises,
    saying the plan is for inference."""
    kind, message = run_workers(support.forward_with_grads, "ltx2")
    assert kind == "RuntimeError" and "for inference" in message and "torch.no_grad()" in message, message
