"""benchmarks/benchmark.py follows kernels.benchmark.Benchmark, so `kernels
benchmark` discovers and runs it against the built variant (on the GPU: every
workload runs and its output matches the eager reference)."""

from __future__ import annotations

import ast

import pytest

from .conftest import ROOT, cuda

# `kernels benchmark` lives in kernels' CLI, which imports cryptography (signature checks); a machine
# without it cannot run the command at all.
pytest.importorskip("cryptography", reason="kernels' CLI (`kernels benchmark`) needs cryptography")

SCRIPT = ROOT / "benchmarks" / "benchmark.py"


def discovered():
    from kernels.cli.benchmark import discover_benchmark_classes, discover_benchmark_scripts

    assert SCRIPT in discover_benchmark_scripts(str(ROOT), ROOT)
    return discover_benchmark_classes(SCRIPT, ROOT)


def workloads(cls) -> list[str]:
    return [n.removeprefix("benchmark_") for n in dir(cls) if n.startswith("benchmark_")]


def test_kernels_discovers_one_class_per_op_family_each_with_workloads():
    classes = {c.__name__: c for c in discovered()}
    assert {"RMSNormBenchmark", "AdaLNRMSNormBenchmark", "GatedResidualBenchmark", "GEGLUBenchmark",
            "RotaryBenchmark", "QKNormRopeBenchmark", "PixelNormBenchmark", "Rope3DBenchmark"} == set(classes)
    for cls in classes.values():
        assert workloads(cls), cls.__name__
        for w in workloads(cls):
            assert hasattr(cls, f"setup_{w}"), f"{cls.__name__}.setup_{w}"
            if cls.__name__ != "Rope3DBenchmark":  # in place: timed only (docstring)
                assert hasattr(cls, f"verify_{w}"), f"{cls.__name__}.verify_{w}"


def test_script_imports_only_torch_and_kernels_benchmark():
    """It is uploaded with the build and runs in the consumer's environment."""
    tree = ast.parse(SCRIPT.read_text())
    modules = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert modules <= {"torch", "kernels"}


@cuda
def test_every_workload_runs_and_matches_its_reference_on_the_gpu():
    from kernels.cli.benchmark import run_benchmark_class

    for cls in discovered():
        results, _ = run_benchmark_class(cls, iterations=3, warmup=1, repo_id=str(ROOT), is_local=True,
                                         revision="local")
        assert set(results) == set(workloads(cls))
        for name, timing in results.items():
            assert timing.mean_ms > 0
            if cls.__name__ != "Rope3DBenchmark":
                assert timing.verified is True, f"{cls.__name__}.{name}"
