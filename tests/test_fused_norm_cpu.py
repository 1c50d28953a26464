"""The fused norm family without a GPU: the ops exist with their schemas,
their fake implementations give the output shapes (meta tensors, as
torch.compile traces them), and CPU tensors get errors naming the argument."""

from __future__ import annotations

import pytest
import torch

EPS = 1e-6
OPS = ["adaln_rmsnorm", "rmsnorm_residual", "gated_residual_rmsnorm", "gated_residual",
       "residual_tanh_gated_rmsnorm", "modulated_rmsnorm"]


@pytest.mark.parametrize("name", OPS)
def test_op_is_registered_as_mutating_its_outputs(kernel, name):
    schema = getattr(kernel.ops, name).default._schema
    assert schema.arguments[0].name == "out" and schema.arguments[0].alias_info.is_write
    assert not schema.returns


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_fake_implementations_give_output_shapes_and_dtypes(kernel):
    x, s = _meta(2, 7, 64), _meta(2, 1, 64)
    assert kernel.adaln_rmsnorm(x, None, s, s).shape == (2, 7, 64)
    out, res = kernel.rmsnorm_residual(x, x)
    assert out.shape == res.shape == (2, 7, 64) and out.dtype == torch.bfloat16
    out, x_new = kernel.gated_residual_rmsnorm(x, x, s, s, s)
    assert out.shape == x_new.shape == (2, 7, 64)
    assert kernel.gated_residual(x, x, s).device.type == "meta"
    assert kernel.residual_tanh_gated_rmsnorm(x, x, _meta(2, 64)).shape == (2, 7, 64)
    assert kernel.modulated_rmsnorm(x, _meta(2, 64)).shape == (2, 7, 64)


def test_gated_residual_in_place_returns_x(kernel):
    x = _meta(2, 3, 32)
    assert kernel.gated_residual(x, x, None, inplace=True) is x


@pytest.mark.parametrize("call, exc, message", [
    (lambda k, x: k.adaln_rmsnorm(x, None, x[:, :1], None), RuntimeError, "`input` must be a CUDA tensor"),
    (lambda k, x: k.adaln_rmsnorm(x[None], None, x, None), RuntimeError, "[batch, seq, hidden], got 4 dims"),
    (lambda k, x: k.gated_residual(x.double(), x.double()), TypeError, "`x` has dtype Double"),
    (lambda k, x: k.residual_tanh_gated_rmsnorm(x, x, x[:, 0]), RuntimeError, "`x_res` must be a CUDA tensor"),
    (lambda k, x: k.rmsnorm_residual(x, x, rounding="C"), ValueError, "`rounding` must be one of"),
])
def test_cpu_and_malformed_inputs_get_errors_naming_the_argument(kernel, call, exc, message):
    x = torch.randn(2, 4, 16, dtype=torch.bfloat16)
    with pytest.raises(exc, match=__import__("re").escape(message)):
        call(kernel, x)


# --- the differentiable path (issue 36) ------------------------------------------------------------

F32 = torch.float32


def _leaf(*shape, dtype=torch.bfloat16):
    return _meta(*shape, dtype=dtype).requires_grad_()


# Each op called on meta leaves: (call, the leaves by argument name). x is [2, 7, 64]; per-batch,
# per-token and [hidden] modulation; float32 modulation where the op takes it.
def _differentiable_calls():
    x = lambda: _leaf(2, 7, 64)  # noqa: E731
    return {
        "rmsnorm_residual": (lambda k, a: k.rmsnorm_residual(a["input"], a["residual"], a["weight"],
                                                             rounding="diffusers"),
                             {"input": x(), "residual": x(), "weight": _leaf(64)}),
        "adaln_rmsnorm": (lambda k, a: k.adaln_rmsnorm(a["input"], a["weight"], a["scale"], a["shift"]),
                          {"input": x(), "weight": _leaf(64), "scale": _leaf(2, 1, 64), "shift": _leaf(2, 7, 64)}),
        "gated_residual": (lambda k, a: k.gated_residual(a["x"], a["y"], a["gate"]),
                           {"x": x(), "y": x(), "gate": _leaf(2, 64, dtype=F32)}),
        "gated_residual_rmsnorm": (lambda k, a: k.gated_residual_rmsnorm(a["x"], a["y"], a["gate"], a["scale"],
                                                                         a["shift"], weight=a["weight"]),
                                   {"x": x(), "y": x(), "gate": _leaf(2, 1, 64), "scale": _leaf(64),
                                    "shift": _leaf(1, 7, 64), "weight": _leaf(64)}),
        "residual_tanh_gated_rmsnorm": (lambda k, a: k.residual_tanh_gated_rmsnorm(a["x"], a["x_res"], a["gate"]),
                                        {"x": x(), "x_res": x(), "gate": _leaf(2, 64, dtype=F32)}),
        "modulated_rmsnorm": (lambda k, a: k.modulated_rmsnorm(a["x"], a["scale"]),
                              {"x": x(), "scale": _leaf(2, 64)}),
    }


def _outputs(result):
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.parametrize("name", OPS)
def test_autograd_records_each_op_and_gives_every_input_its_grad(kernel, name):
    """The registered backward runs on meta tensors (through the ops' fakes): each leaf gets a grad of its
    own shape and dtype, whatever it broadcast from."""
    call, leaves = _differentiable_calls()[name]
    outputs = _outputs(call(kernel, leaves))
    assert all(o.requires_grad and o.grad_fn is not None for o in outputs)
    torch.autograd.backward(outputs, [torch.empty_like(o) for o in outputs])
    for arg, t in leaves.items():
        assert t.grad is not None, arg
        assert (t.grad.shape, t.grad.dtype) == (t.shape, t.dtype), arg


@pytest.mark.parametrize("name", OPS)
def test_only_the_leaves_that_require_grad_get_one(kernel, name):
    call, leaves = _differentiable_calls()[name]
    for arg, t in leaves.items():
        t.requires_grad_(arg in ("x", "input") or t.dim() == 1)  # the main input and the [hidden] tensors
    outputs = _outputs(call(kernel, leaves))
    torch.autograd.backward(outputs, [torch.empty_like(o) for o in outputs])
    for arg, t in leaves.items():
        assert (t.grad is not None) == t.requires_grad, arg


def test_without_grad_mode_the_fused_ops_are_not_recorded(kernel):
    call, leaves = _differentiable_calls()["gated_residual_rmsnorm"]
    with torch.no_grad():
        assert all(o.grad_fn is None for o in call(kernel, leaves))


def test_gated_residual_in_place_while_recording_follows_autograds_in_place_rules(kernel):
    x, y = _leaf(2, 3, 32), _leaf(2, 3, 32)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        kernel.gated_residual(x, y, None, inplace=True)
    base = x.detach().clone()  # not a leaf that requires grad: it joins the graph
    out = kernel.gated_residual(base, y, None, inplace=True)
    assert out is base and out.grad_fn is not None


def test_functional_op_schemas_mutate_nothing(kernel):
    for name in OPS:
        schema = getattr(kernel.ops, f"{name}_fwd").default._schema
        assert all(a.alias_info is None for a in schema.arguments), name
        assert all(r.type.kind() == "TensorType" for r in schema.returns), name
    bwd = kernel.ops.fused_norm_bwd.default._schema
    assert all(a.alias_info is None for a in bwd.arguments)
    assert [r.name for r in bwd.returns] == ["grad_h", "grad_y", "grad_gate", "grad_weight", "grad_scale",
                                             "grad_shift"]


def _bwd_args(**change):
    x = torch.randn(2, 4, 16, dtype=torch.bfloat16)
    args = {"op": "adaln_rmsnorm", "grad_out": x, "grad_sum": None, "h": x, "y": None, "gate": None,
            "weight": torch.ones(16, dtype=torch.bfloat16), "scale": torch.ones(2, 1, 16, dtype=torch.bfloat16),
            "shift": None, "eps": EPS, "scale_offset": 1.0, "exact_mode": True, "y_grad": False,
            "gate_grad": False, "weight_grad": True, "scale_grad": True, "shift_grad": False}
    return list({**args, **change}.values())


@pytest.mark.parametrize("change, message", [
    ({}, "ltx_kernels.fused_norm_bwd: `h` must be a CUDA tensor"),
    ({"op": "layernorm"}, "unknown op `layernorm`"),
    ({"grad_out": None}, "`grad_out` is required (op `adaln_rmsnorm`)"),
    ({"grad_sum": torch.ones(2, 4, 16, dtype=torch.bfloat16)}, "`grad_sum` must be None (op `adaln_rmsnorm`)"),
    ({"scale": None, "scale_grad": False}, "`scale` is required (op `adaln_rmsnorm`)"),
    ({"gate": torch.ones(16, dtype=torch.bfloat16)}, "this op has no `gate` (op `adaln_rmsnorm`)"),
    ({"weight": None}, "`weight_grad` is true but there is no `weight`"),
    ({"shift_grad": True}, "`shift_grad` is true but there is no `shift`"),
    ({"op": "gated_residual", "grad_out": None, "grad_sum": torch.ones(2, 4, 16, dtype=torch.bfloat16),
      "weight": None, "weight_grad": False, "scale": None, "scale_grad": False,
      "gate": torch.ones(16, dtype=torch.bfloat16), "gate_grad": True}, "`gate_grad` needs `y`"),
])
def test_backward_binding_names_the_bad_argument(kernel, change, message):
    with pytest.raises(RuntimeError, match=__import__("re").escape(message)):
        kernel.ops.fused_norm_bwd(*_bwd_args(**change))


@pytest.mark.parametrize("shape, grad_shape", [((2, 1, 16), (2, 1, 16)), ((16,), (16,)), ((1, 4, 16), (1, 4, 16)),
                                               ((2, 16), (2, 16))])
def test_backward_fake_gives_modulation_grads_of_the_modulation_shape(kernel, shape, grad_shape):
    h = _meta(2, 4, 16)
    scale = _meta(*shape, dtype=F32)
    grads = kernel.ops.fused_norm_bwd("adaln_rmsnorm", h, None, h, None, None, None, scale, scale, EPS, 1.0, True,
                                      False, False, False, True, True)
    dh, dy, dgate, dw, dscale, dshift = grads
    assert dh.shape == (2, 4, 16) and dy is None and dgate is None and dw is None
    assert (dscale.shape, dscale.dtype) == (grad_shape, F32) and dshift.shape == grad_shape


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("size, path", [("small", "vector"), ("medium", "fallback")])
def test_registry_references_are_differentiable_in_float64(name, size, path):
    """The central backward sweep differentiates each spec's reference on float64 copies of the args:
    every floating tensor argument must get a finite grad from every output."""
    from ltx_dev.registry import OPS as SPECS, Source

    spec = next(s for s in SPECS if s.api == name)
    args, _ = spec.build(spec.canonical(size, path), F32, Source(0, "cpu"))
    args = {k: v.detach().double().requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in args.items()}
    leaves = [v for v in args.values() if isinstance(v, torch.Tensor) and v.requires_grad]
    for expect in spec.reference(args):
        grads = torch.autograd.grad(expect.value.sum(), leaves, allow_unused=True, retain_graph=True)
        assert expect.value.dtype == torch.float64 and expect.value.requires_grad
        assert all(g is None or torch.isfinite(g).all() for g in grads)
    total = sum(e.value.sum() for e in spec.reference(args))
    assert all(g is not None for g in torch.autograd.grad(total, leaves, allow_unused=True))
