"""The FP8 linear's Python side without a GPU: ``Fp8Linear.from_rows`` and ``Fp8Linear.concat`` on
e4m3 rows made on the CPU (the GEMM itself runs in test_fp8_gpu.py)."""

from __future__ import annotations

import pytest
import torch

E4M3 = torch.float8_e4m3fn


def linear(kernel, n: int, k: int = 32, bias: bool = True, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    rows = kernel.Fp8Rows(torch.randn(n, k, generator=g).to(E4M3), torch.rand(n, generator=g) + 0.5)
    return kernel.Fp8Linear.from_rows(rows, torch.randn(n, generator=g) if bias else None)


def test_from_rows_keeps_the_rows_and_reads_its_shape_from_them(kernel):
    m = linear(kernel, 48)
    assert (m.out_features, m.in_features, m.out_dtype) == (48, 32, torch.bfloat16)
    assert sorted(m.state_dict()) == ["bias", "weight_data", "weight_scale"] and m.parts == ()


def test_concat_joins_the_rows_and_makes_the_parts_views_of_them(kernel):
    parts = [linear(kernel, n, seed=i) for i, n in enumerate((48, 16, 16))]
    before = [(m.weight_data.float().clone(), m.weight_scale.clone(), m.bias.clone()) for m in parts]
    joined = kernel.Fp8Linear.concat(parts)
    assert (joined.out_features, joined.in_features) == (80, 32) and joined.state_dict() == {}
    start = 0
    for m, (data, scale, bias) in zip(parts, before):
        assert torch.equal(m.weight_data.float(), data) and torch.equal(m.weight_scale, scale)
        assert torch.equal(m.bias, bias)
        assert m.weight_data.data_ptr() == joined.weight_data[start].data_ptr()
        assert m.bias.data_ptr() == joined.bias[start].data_ptr()
        start += m.out_features


def test_a_move_of_the_module_holding_both_keeps_the_parts_views_of_the_joined_rows(kernel):
    holder = torch.nn.Module()
    holder.q, holder.k = linear(kernel, 16, seed=1), linear(kernel, 16, seed=2)
    holder.qk = kernel.Fp8Linear.concat((holder.q, holder.k))
    holder._apply(lambda t: t.clone())  # what .to(device) does to every tensor: a new one each
    assert holder.k.weight_data.data_ptr() == holder.qk.weight_data[16].data_ptr()
    assert holder.q.weight_scale.data_ptr() == holder.qk.weight_scale.data_ptr()
    assert holder.k.bias.data_ptr() == holder.qk.bias[16].data_ptr()


def test_concat_refuses_linears_that_read_different_inputs_or_are_not_fp8(kernel):
    with pytest.raises(ValueError, match="differ in .in_features"):
        kernel.Fp8Linear.concat([linear(kernel, 16, k=32), linear(kernel, 16, k=64)])
    with pytest.raises(ValueError, match="differ in"):
        kernel.Fp8Linear.concat([linear(kernel, 16), linear(kernel, 16, bias=False)])
    with pytest.raises(TypeError, match="expected one or more Fp8Linear"):
        kernel.Fp8Linear.concat([torch.nn.Linear(32, 16)])


@pytest.mark.parametrize("data, scale, bias", [
    (torch.zeros(16, 32), torch.ones(16), None),  # not e4m3
    (torch.zeros(16, 32, dtype=E4M3), torch.ones(8), None),  # a scale per row
    (torch.zeros(16, 32, dtype=E4M3), torch.ones(16, dtype=torch.float64), None),
    (torch.zeros(2, 16, 32, dtype=E4M3), torch.ones(2, 16), None),
    (torch.zeros(16, 32, dtype=E4M3), torch.ones(16), torch.zeros(32)),
])
def test_from_rows_refuses_rows_that_are_not_a_quantised_weight(kernel, data, scale, bias):
    with pytest.raises(ValueError, match="expected e4m3 rows .N, K., float32 scales .N."):
        kernel.Fp8Linear.from_rows(kernel.Fp8Rows(data, scale), bias)
