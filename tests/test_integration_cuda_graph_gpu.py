"""optimize(..., cuda_graph=True) on the GPU with the built kernel (skipped without CUDA): LTX-Video
2B's blocks (2 layers, 2688 tokens), Wan 1.3B's and Flux's at a few blocks. Every replay must equal
the forward it stands for bit for bit: the same kernels on the same inputs. Each case checks a
change the graph has to see (new inputs, a new shape, replaced or edited weights, another
processor, a rescaled LoRA, model CPU offload) or a forward it cannot capture."""

from __future__ import annotations

import warnings

import pytest
import torch

from .conftest import cuda

pytestmark = cuda
pytest.importorskip("diffusers")

from ltx_kernels_diffusers import CudaGraphWarning, optimize, reset_cuda_graphs, restore  # noqa: E402
from ltx_kernels_diffusers.cuda_graph import cuda_graph_hook  # noqa: E402

from .integration_support import LTX_2B_VIDEO, flux_inputs, flux_model, ltx_inputs, wan_inputs, wan_model  # noqa: E402
from .test_integration_gpu import forward, ltx_model  # noqa: E402


def ltx():
    model = ltx_model(torch.bfloat16, num_layers=2)
    return model, ltx_inputs(model, **LTX_2B_VIDEO), ltx_inputs(model, **LTX_2B_VIDEO, seed=2)


def ungraphed(model, inputs):
    """The forward the graph stands for: the hook's own, called past it."""
    with torch.no_grad():
        return cuda_graph_hook(model).fn_ref.original_forward(**inputs)[0]


def graphed(model, inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("error", CudaGraphWarning)
        return forward(model, inputs)


def test_replays_equal_the_forward_bit_for_bit_and_a_returned_output_survives_the_next_call(kernel):
    model, a, b = ltx()
    optimize(model, kernel=kernel)
    expected_a, expected_b = forward(model, a), forward(model, b)
    optimize(model, kernel=kernel, cuda_graph=True)
    got_a = graphed(model, a)
    got_b = graphed(model, b)
    assert torch.equal(got_a, expected_a) and torch.equal(got_b, expected_b)
    assert torch.equal(graphed(model, a), expected_a)
    assert torch.equal(got_a, expected_a)  # a clone: not overwritten by the later replays
    assert len(cuda_graph_hook(model).graphs) == 1


def test_inference_mode_and_no_grad_get_graphs_of_their_own(kernel):
    model, a, _ = ltx()
    optimize(model, kernel=kernel, cuda_graph=True)
    with torch.inference_mode():
        first = model(**a)[0]
    assert torch.equal(graphed(model, a), first)  # no_grad: writing inference-mode inputs would raise
    assert len(cuda_graph_hook(model).graphs) == 2


def test_a_new_shape_gets_its_own_graph(kernel):
    model, a, _ = ltx()
    small = ltx_inputs(model, **{**LTX_2B_VIDEO, "frames": 3})
    optimize(model, kernel=kernel, cuda_graph=True)
    assert torch.equal(graphed(model, small), ungraphed(model, small))
    assert torch.equal(graphed(model, a), ungraphed(model, a))
    assert torch.equal(graphed(model, small), ungraphed(model, small))
    assert len(cuda_graph_hook(model).graphs) == 2


def test_edited_weights_are_read_and_replaced_weights_are_captured_again(kernel):
    model, a, _ = ltx()
    optimize(model, kernel=kernel, cuda_graph=True)
    graphed(model, a)
    hook = cuda_graph_hook(model)
    first = hook.graphs[next(iter(hook.graphs))]
    weight = model.transformer_blocks[1].ff.net[2].weight
    with torch.no_grad():
        weight.mul_(1.5)  # in place: the graph reads the same memory
    assert torch.equal(graphed(model, a), ungraphed(model, a))
    assert hook.graphs[next(iter(hook.graphs))] is first
    weight.data = weight.data * 0.5  # new memory: the old graph would read the old weight
    assert torch.equal(graphed(model, a), ungraphed(model, a))
    assert hook.graphs[next(iter(hook.graphs))] is not first


def test_another_attention_processor_drops_the_graphs(kernel):
    from diffusers.models.transformers.transformer_ltx import LTXVideoAttnProcessor

    class Doubled(LTXVideoAttnProcessor):
        def __call__(self, *args, **kwargs):
            return 2 * super().__call__(*args, **kwargs)

    model, a, _ = ltx()
    optimize(model, kernel=kernel, cuda_graph=True)
    before = graphed(model, a)
    model.transformer_blocks[0].attn1.set_processor(Doubled())
    after = graphed(model, a)
    assert torch.equal(after, ungraphed(model, a)) and not torch.equal(after, before)


def test_a_rescaled_lora_drops_the_graphs(kernel):
    peft = pytest.importorskip("peft")
    model, a, _ = ltx()
    optimize(model, kernel=kernel, cuda_graph=True)
    model.add_adapter(peft.LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_v"], init_lora_weights=False))
    with_lora = graphed(model, a)
    assert torch.equal(with_lora, ungraphed(model, a))
    for layer in model.modules():
        if isinstance(layer, peft.tuners.lora.LoraLayer):
            layer.set_scale("default", 0.25)
    rescaled = graphed(model, a)
    assert torch.equal(rescaled, ungraphed(model, a)) and not torch.equal(rescaled, with_lora)


def test_a_forward_that_synchronises_runs_as_it_is_saying_why(kernel):
    model, a, _ = ltx()
    optimize(model, kernel=kernel, cuda_graph=True)
    model.proj_in.register_forward_pre_hook(lambda module, args: None if args[0].sum().item() else None)
    with pytest.warns(CudaGraphWarning, match="synchronises with the host"):
        got = forward(model, a)
    assert torch.equal(got, ungraphed(model, a))
    assert torch.equal(forward(model, a), got)
    assert torch.cuda.get_sync_debug_mode() == 0
    torch.randn(4, device="cuda")  # no capture began: CUDA's random generator still works


def test_model_cpu_offload_moves_the_weights_and_the_graph_follows(kernel):
    pytest.importorskip("accelerate")
    from .test_integration_gpu import transformer_only_pipeline

    model, a, b = ltx()
    pipe = transformer_only_pipeline(model)
    optimize(pipe, kernel=kernel)
    expected_a, expected_b = forward(model, a), forward(model, b)
    optimize(pipe, kernel=kernel, cuda_graph=True)
    pipe.transformer.to("cpu")
    pipe.enable_model_cpu_offload()
    assert torch.equal(graphed(pipe.transformer, a), expected_a)
    assert torch.equal(graphed(pipe.transformer, b), expected_b)
    with pytest.raises(Exception, match="remove_all_hooks"):
        restore(pipe)


def test_compiled_blocks_replay_their_compiled_forward(kernel):
    torch._dynamo.reset()
    model, a, b = ltx()
    optimize(model, kernel=kernel, cuda_graph=True)
    model.compile_repeated_blocks(fullgraph=True)
    graphed(model, a)
    assert torch.equal(graphed(model, b), ungraphed(model, b))
    reset_cuda_graphs(model)
    assert not cuda_graph_hook(model).graphs
    assert torch.equal(graphed(model, a), ungraphed(model, a))


@pytest.mark.parametrize("name", ["wan", "flux"])
def test_hook_based_models_replay_bit_for_bit(kernel, name):
    if name == "wan":
        model = wan_model(torch.bfloat16, device="cuda", num_layers=2)
        make = lambda seed: wan_inputs(model, batch=2, frames=3, height=30, width=40, text=512, seed=seed)  # noqa: E731
    else:
        model = flux_model(torch.bfloat16, device="cuda", num_layers=1, num_single_layers=2)
        make = lambda seed: flux_inputs(model, batch=1, height=32, width=32, text=512, seed=seed)  # noqa: E731
    optimize(model, kernel=kernel, cuda_graph=True)
    for seed in (1, 2):
        inputs = make(seed)
        assert torch.equal(graphed(model, inputs), ungraphed(model, inputs))
