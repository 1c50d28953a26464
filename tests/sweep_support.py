"""The random-problem sweep over registry ops that the forward (test_robustness_gpu.py)
and backward (test_backward_gpu.py) GPU tests share: problems drawn by hypothesis
where it is installed (a failure shrinks), else seeded random problems."""

from __future__ import annotations

import pytest

from ltx_dev.registry import DrawPick, RandomPick

try:
    from hypothesis import HealthCheck, given, note, settings
    from hypothesis import strategies as st
except ImportError:  # seeded random problems instead (no shrinking)
    given = None


def ids(specs):
    return [s.name for s in specs]


def random_problems_test(specs, examples, check):
    """A test, parametrized over `specs`, that runs `check(kernel, spec, pick, dtype, seed)` on
    `examples` random problems of each spec (assign it to a `test_...` name of the module)."""
    if given is not None:
        @pytest.mark.parametrize("spec", specs, ids=ids(specs))
        @settings(max_examples=examples, deadline=None, database=None, print_blob=True,
                  suppress_health_check=list(HealthCheck))
        @given(data=st.data())
        def test(kernel, spec, data):
            dtype = data.draw(st.sampled_from(spec.dtypes), label="dtype")
            seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
            note(f"{spec.name} {dtype} seed {seed}")
            check(kernel, spec, DrawPick(data), dtype, seed)
    else:
        @pytest.mark.parametrize("spec", specs, ids=ids(specs))
        def test(kernel, spec):
            for seed in range(examples):
                pick = RandomPick(seed)
                check(kernel, spec, pick, pick.choice(spec.dtypes), seed)
    return test
