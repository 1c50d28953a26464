"""The ltx-dev command line without a GPU: every subcommand parses its options, the GPU session
runs its steps in order (dev build and tests, then release build and benchmarks, then targets)
with commands faked, and the benchmark harness' common options select and name rows as
documented."""

from __future__ import annotations

import ast
import runpy
import shutil
import sys
import tarfile
import types
from pathlib import Path

import pytest

from ltx_dev import ab, host_cost, proc, profile, sanitize, session, wheels
from ltx_dev.bench import FAMILIES, harness
from ltx_dev.cli import main, parser
from ltx_dev.paths import BENCHMARKS, ROOT

TOOLS = ROOT / "tools"  # where the ltx_dev package lives


def parse(*argv):
    return parser().parse_args(list(argv))


# --- parsing ------------------------------------------------------------------------------------

def test_gpu_session_options_replace_the_old_environment_variables():
    a = parse("gpu-session", "--require-gpu", "H200", "--tests", "tests/test_rmsnorm_gpu.py", "--benches", "rmsnorm",
              "vae", "--bench-args", "--quick --rounds 3", "--stop-after", "1200", "--pack", "--commit", "abc",
              "--bench-timeout", "60", "--out", "/tmp/o")
    assert (a.require_gpu, a.tests, a.benches, a.bench_args, a.stop_after, a.pack, a.commit, a.bench_timeout) == (
        "H200", ["tests/test_rmsnorm_gpu.py"], ["rmsnorm", "vae"], "--quick --rounds 3", 1200, True, "abc", 60)
    d = parse("gpu-session")
    assert d.tests is None and d.benches is None and not d.pack and d.bench_timeout == 900 and d.jobs == 16
    assert parse("gpu-session", "--benches").benches == []  # none at all


def test_the_other_subcommands_parse_their_options():
    assert parse("wheels", "--dest", "/tmp/w").dest == Path("/tmp/w")
    a = parse("ab", "fused_norm", "--bench-args=--only gated_residual", "--commit", "abc", "--dev-build")
    assert (a.bench, a.bench_args, a.commit, a.dev_build) == ("fused_norm", "--only gated_residual", "abc", True)
    s = parse("sanitize", "memcheck", "initcheck", "--quick", "--parallel", "--timeout", "60")
    assert (s.tools, s.quick, s.parallel, s.timeout) == (["memcheck", "initcheck"], True, True, 60)
    assert parse("sanitize").tools == []
    assert parse("sanitize-driver", "control", "--tool", "racecheck").what == "control"
    assert parse("sanitize-summary", "a.log", "b.log", "--markdown", "s.md").logs == ["a.log", "b.log"]
    p = parse("profile", "fused_norm", "--only", "gated_residual", "--shape", "2,2688,2048", "--flush")
    assert (p.family, p.bench_args) == ("fused_norm", ["--only", "gated_residual", "--shape", "2,2688,2048", "--flush"])
    h = parse("host-cost", "--dev-build", "--calls", "50")
    assert (h.dev_build, h.calls, h.loops, h.attributes, h.training_graph) == (True, 50, 7, False, False)
    assert parse("host-cost", "--training-graph").training_graph
    assert parse("targets", "x.json").results == [Path("x.json")]


@pytest.mark.parametrize("argv", [["sanitize", "memchek"], ["profile", "attention"], ["gpu-session", "--pack=1"],
                                  ["bogus"]])
def test_wrong_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse(*argv)
    assert e.value.code == 2


# --- the GPU session --------------------------------------------------------------------------------

@pytest.fixture
def fake_commands(monkeypatch):
    """Record the session's commands instead of running them; each writes its log. `fail` names the
    commands (by a word in them) that exit 1."""
    ran: list[list[str]] = []
    fail: set[str] = set()

    def run_logged(cmd, log=None, **kwargs):
        cmd = [str(c) for c in cmd]
        ran.append(cmd)
        if log:
            Path(log).write_text(" ".join(cmd) + "\n")
        if "--out" in cmd:  # a benchmark writes its JSON
            (Path(cmd[cmd.index("--out") + 1]) / f"{cmd[2].rsplit('_', 1)[-1]}-H200.json").write_text("{}")
        return 1 if any(word in cmd for word in fail) else 0

    monkeypatch.setattr(proc, "run_logged", run_logged)
    def gpu_query(fields="name"):
        return ["NVIDIA H200, 143771 MiB, 580.95" if "driver" in fields else "NVIDIA H200"]

    monkeypatch.setattr(proc, "gpu_query", gpu_query)
    return types.SimpleNamespace(ran=ran, fail=fail)


def test_a_session_on_the_wrong_gpu_runs_nothing(fake_commands, tmp_path):
    assert main(["gpu-session", "--require-gpu", "H100", "--out", str(tmp_path)]) == 0
    assert fake_commands.ran == [] and list(tmp_path.iterdir()) == []


def test_the_session_tests_the_dev_build_then_benchmarks_the_release_build(fake_commands, tmp_path, capsys):
    rc = main(["gpu-session", "--out", str(tmp_path), "--tests", "tests/test_vae_gpu.py", "--pytest-args=-x",
               "--benches", "rmsnorm", "vae", "--bench-args=--quick", "--commit", "abc123", "--no-install"])
    assert rc == 0
    dev, tests, release, rmsnorm, vae, targets = fake_commands.ran
    assert dev[1:] == ["-m", "ltx_build", "build", "-j", "16", "--allow-newer-glibc", "--dev"]
    assert tests[1:4] == ["-m", "pytest", "-q"] and tests[-3:] == ["tests/test_vae_gpu.py", "--dev-build", "-x"]
    assert "--dev" not in release and release[1:4] == ["-m", "ltx_build", "build"]
    assert rmsnorm[1:3] == ["-m", "benchmarks.bench_rmsnorm"] and vae[2] == "benchmarks.bench_vae"
    assert rmsnorm[3:] == ["--out", str(tmp_path), "--commit", "abc123", "--quick"]
    assert targets[1:4] == ["-m", "ltx_dev", "targets"] and len(targets) == 6  # the two JSON files
    out = capsys.readouterr().out
    for step in ("dev build", "tests (dev build)", "release build", "bench_rmsnorm", "targets"):
        assert f"] {step}\n" in out and f"] {step}: exit 0 after " in out
    assert "release build" in (tmp_path / "steps.txt").read_text()
    assert (tmp_path / "device.txt").read_text() == "NVIDIA H200, 143771 MiB, 580.95\n"


def test_a_failed_dev_build_skips_the_tests_but_not_the_benchmarks(fake_commands, tmp_path):
    fake_commands.fail.add("--dev")
    rc = main(["gpu-session", "--out", str(tmp_path), "--benches", "rope", "--no-install"])
    assert rc == 1
    assert [c[2] for c in fake_commands.ran[:3]] == ["ltx_build", "ltx_build", "benchmarks.bench_rope"]


def test_release_tests_run_the_same_tests_against_the_release_build(fake_commands, tmp_path):
    rc = main(["gpu-session", "--out", str(tmp_path), "--tests", "tests/test_vae_gpu.py", "--release-tests",
               "--benches", "--no-install"])
    assert rc == 0
    dev, dev_tests, release, release_tests = fake_commands.ran[:4]
    assert "--dev" in dev and dev_tests[-2:] == ["tests/test_vae_gpu.py", "--dev-build"]
    assert "--dev" not in release and release_tests[1:3] == ["-m", "pytest"]
    assert release_tests[-1] == "tests/test_vae_gpu.py" and "--dev-build" not in release_tests


def test_without_tests_the_session_builds_no_development_variant(fake_commands, tmp_path):
    main(["gpu-session", "--out", str(tmp_path), "--tests", "--benches", "rope", "--no-install"])
    assert not any("--dev" in c for c in fake_commands.ran)


def test_stop_after_starts_no_benchmark_once_the_time_is_gone(fake_commands, tmp_path):
    main(["gpu-session", "--out", str(tmp_path), "--tests", "--stop-after", "0", "--no-install"])
    assert not any("benchmarks" in " ".join(c) for c in fake_commands.ran)
    assert not any("pytest" in c for c in fake_commands.ran)  # --tests with no value: none


def test_pack_puts_every_log_into_one_tar(fake_commands, tmp_path):
    main(["gpu-session", "--out", str(tmp_path), "--benches", "rmsnorm", "--pack", "--no-install"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.tar"]
    with tarfile.open(tmp_path / "results.tar") as tar:
        names = set(tar.getnames())
    assert {"build-dev.log", "tests.log", "build.log", "bench_rmsnorm.log", "targets.log", "device.txt",
            "steps.txt"} <= names


def test_benchmarks_are_named_by_family_file_or_path():
    every = session.bench_files(None)
    assert [p.stem for p in every] == sorted(f"bench_{f}" for f in (*FAMILIES, "attention"))
    assert session.bench_files(["qk_rmsnorm_rope", "bench_vae.py", "benchmarks/bench_rope.py", "generate_video"]) == [
        BENCHMARKS / "bench_qk_rmsnorm_rope.py", BENCHMARKS / "bench_vae.py", BENCHMARKS / "bench_rope.py",
        BENCHMARKS / "generate_video.py"]
    with pytest.raises(SystemExit, match="no benchmarks/bench_nope.py"):
        session.bench_files(["nope"])
    assert session.module_of(BENCHMARKS / "bench_vae.py") == "benchmarks.bench_vae"


def test_the_default_tests_are_the_op_tests_not_the_builder_tests():
    tests = session.test_paths(None)
    assert "tests/test_rmsnorm_gpu.py" in tests and "tests/test_reference.py" in tests
    assert "tests/test_builder.py" not in tests and "tests/test_publish.py" not in tests


def test_a_command_past_its_limit_is_stopped_and_its_output_logged(tmp_path):
    log = tmp_path / "x.log"
    code = "import time; print('started', flush=True); print('a warn' + 'ing line', flush=True); time.sleep(30)"
    rc = proc.run_logged(proc.python("-c", code), log, timeout=1, drop="warning")
    assert rc == proc.TIMED_OUT
    text = log.read_text()
    assert text.startswith("started\n") and "warning" not in text and "stopped after its limit of 1 s" in text


def test_steps_print_a_start_line_and_their_elapsed_time(capsys):
    steps = proc.Steps()
    assert steps.run("build", lambda: 3) == 3
    out = capsys.readouterr().out
    assert "] build\n" in out and "] build: exit 3 after 0.0 s" in out
    assert "build" in steps.summary() and "exit 3" in steps.summary()


# --- the other commands --------------------------------------------------------------------------------

def test_wheels_are_downloaded_for_the_gpu_machines_python():
    cmd = wheels.download_command(Path("/tmp/w"), "3.12")
    assert cmd[1:4] == ["-m", "pip", "download"] and cmd[cmd.index("--python-version") + 1] == "3.12"
    assert "kernels==0.17.2" in cmd and "--no-deps" in cmd and cmd[cmd.index("-d") + 1] == "/tmp/w"


def test_ab_copies_the_tree_with_b_kernel_sources_and_without_builds(tmp_path, monkeypatch):
    tree = tmp_path / "repo"
    for path in ("kernel_src/a.cu", "build/x.so", "_build/dev/y", "tools/ltx_dev/paths.py", "benchmarks/bench_rmsnorm.py"):
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(path)
    (tmp_path / "b" / "kernel_src").mkdir(parents=True)
    (tmp_path / "b" / "kernel_src" / "a.cu").write_text("B")
    monkeypatch.setattr(ab, "ROOT", tree)
    copy = ab.copy_b(tmp_path / "b" / "kernel_src")
    try:
        assert (copy / "kernel_src" / "a.cu").read_text() == "B"
        assert (copy / "tools" / "ltx_dev" / "paths.py").is_file() and (copy / "benchmarks" / "bench_rmsnorm.py").is_file()
        assert not (copy / "build").exists() and not (copy / "_build").exists()
    finally:
        shutil.rmtree(copy)


def test_sanitize_runs_a_control_beside_initcheck_and_racecheck_only():
    assert sanitize.jobs(["memcheck", "initcheck", "racecheck", "synccheck"]) == [
        ("memcheck", "run"), ("initcheck", "run"), ("initcheck", "control"), ("racecheck", "run"),
        ("racecheck", "control"), ("synccheck", "run")]
    assert sanitize.log_name("racecheck", "control") == "control-racecheck.log"
    assert sanitize.log_name("memcheck", "run") == "memcheck.log"


def test_profile_runs_the_familys_benchmark_in_profile_mode():
    for family in FAMILIES:
        argv = profile.bench_argv(family, ["--only", "x"])
        assert Path(argv[0]).is_file() and argv[1:] == ["--profile", "--only", "x"]


def test_host_cost_turns_dependent_launch_off_only_on_a_dev_build():
    assert host_cost.settings(False) == {"default": {}}
    assert host_cost.settings(True) == {"default": {}, "dependent_launch=0": {"dependent_launch": 0}}


def test_targets_prints_a_count_per_file(tmp_path, capsys):
    path = tmp_path / "x-H200.json"
    path.write_text('{"env": {"device": "NVIDIA H200", "commit": "abcdef0"}, "rows": ['
                    '{"op": "o", "shape": [1], "impl": "ltx_kernels", "us": 2.0, "frac_copy": 0.5},'
                    '{"op": "o", "shape": [1], "impl": "eager", "us": 1.0, "frac_copy": 0.9}]}')
    assert main(["targets", str(path)]) == 0
    out = capsys.readouterr().out
    assert "x-H200.json (NVIDIA H200, commit abcdef0): 1 row(s) miss a target" in out and "behind eager" in out


# --- the benchmark harness' common options --------------------------------------------------------------

@pytest.fixture
def settings(monkeypatch):
    monkeypatch.setattr(harness, "SETTINGS", harness.Settings())
    return harness.SETTINGS


def configured(*argv, sweep=False):
    ap = harness.parser("doc", "quick", "sweep it" if sweep else None)
    args = ap.parse_args(list(argv))
    harness.configure(args, ap)
    return args


def test_knob_options_need_the_dev_build(settings, capsys):
    for argv in (["--sweep"], ["--sweep-tuning", "fused_norm.prefetch=0,1"], ["--tuning", "dependent_launch=0"]):
        with pytest.raises(SystemExit):
            configured(*argv, sweep=True)
        assert "only a development build has" in capsys.readouterr().err
    configured("--dev-build", "--sweep-tuning", "fused_norm.prefetch=0,1", "--tuning", "dependent_launch=0")
    assert settings.sweeps == [("fused_norm.prefetch", [0, 1])] and settings.tuning == {"dependent_launch": 0}
    with pytest.raises(SystemExit):
        configured("--dev-build", "--tuning", "dependent_launch=0,1")


def test_shapes_select_rows_and_replace_plain_shape_lists(settings):
    args = configured("--shape", "2,8160,2048", "--shape", "2,512,7,32,48;512,1,1,1")
    assert harness.shape_selected((2, 8160, 2048)) and not harness.shape_selected([2, 2688, 2048])
    assert harness.shape_selected(((2, 512, 7, 32, 48), (512, 1, 1, 1)))
    assert harness.shapes([(1, 2, 3)], [(1, 2, 3)], args) == [(2, 8160, 2048)]
    plain = configured("--quick")
    assert harness.shapes([(1, 2, 3), (4, 5, 6)], [(4, 5, 6)], plain) == [(4, 5, 6)]
    assert harness.shape_selected((9, 9))


def test_sweeps_add_tuned_rows_for_our_implementations_only_and_impl_filters_names(settings, monkeypatch):
    kernel = types.SimpleNamespace(ops=types.SimpleNamespace(tuning_knobs=lambda: ["qk_rmsnorm_rope.samples"],
                                                             set_tuning=lambda knob, value: None))
    configured("--dev-build", "--sweep-tuning", "qk_rmsnorm_rope.samples=1,2")
    settings.kernel = kernel
    impls = harness._implementations({"ltx_kernels": lambda: 1, "torch.compile(eager)": lambda: 2})
    assert list(impls) == ["ltx_kernels", "torch.compile(eager)", "ltx_kernels [qk_rmsnorm_rope.samples=1]",
                           "ltx_kernels [qk_rmsnorm_rope.samples=2]"]
    settings.impls = ["compile", "samples=2"]
    assert list(harness._implementations({"ltx_kernels": lambda: 1, "torch.compile(eager)": lambda: 2})) == [
        "torch.compile(eager)", "ltx_kernels [qk_rmsnorm_rope.samples=2]"]


def test_measure_times_every_selected_implementation_and_leaves_out_one_that_fails(settings, monkeypatch, capsys):
    """measure() with the timers faked: a row per implementation with the lower median over --rounds,
    bytes over time against the copy ceiling, and an implementation that raises reported, not kept."""
    steady = {"ltx_kernels": iter([10.0, 12.0, 11.0]), "eager": iter([40.0, 40.0, 40.0])}
    monkeypatch.setattr(harness, "rotating_graph_us", lambda fn, make_args, nbytes: next(steady[fn()]))
    monkeypatch.setattr(harness, "median_us", lambda fn: 50.0)
    configured("--rounds", "3")

    def broken():
        raise RuntimeError("no kernel for this shape")

    rows: list = []
    added = harness.measure(rows, 2.0, "op", (2, 8), {"ltx_kernels": lambda: "ltx_kernels", "eager": lambda: "eager",
                                                     "torch.compile": broken}, lambda i: (), nbytes=11 * 10 ** 6)
    assert added == rows and [r["impl"] for r in rows] == ["ltx_kernels", "eager"]
    ours = rows[0]
    assert (ours["us"], ours["us_flushed"], ours["shape"]) == (11.0, 50.0, [2, 8])
    assert ours["us_rounds"] == [10.0, 12.0, 11.0]
    assert ours["tbps"] == 1.0 and ours["frac_copy"] == 0.5  # 11 MB in 11 us against a 2 TB/s copy
    assert "op torch.compile failed at (2, 8): RuntimeError('no kernel for this shape')" in capsys.readouterr().out
    configured("--only", "other_op")
    assert harness.measure(rows, 2.0, "op", (2, 8), {"eager": lambda: "eager"}, lambda i: (), 1) == []


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("bench_*.py")) + ["generate_video.py"])
def test_every_benchmark_imports_without_path_edits_and_shows_its_help(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [script, "--help"])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(BENCHMARKS / script), run_name="__main__")
    assert e.value.code == 0 and "--out" in capsys.readouterr().out


def test_no_tool_edits_sys_path():
    """ltx_dev and the benchmarks import through the package (an editable install or the repository
    root), never by inserting paths."""
    for path in [*TOOLS.glob("ltx_dev/**/*.py"), *BENCHMARKS.glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", "") == "sys":
                pytest.fail(f"{path.relative_to(ROOT)} uses sys.path")


def module_imports(path: Path) -> set[str]:
    """The ltx_dev modules a module of ltx_dev imports when it is imported (its top-level imports)."""
    package = ".".join(path.relative_to(TOOLS).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    else:
        package = package.removesuffix(".__init__")
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            if module and module.startswith("ltx_dev"):
                found.add(module)
                found.update(f"{module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("ltx_dev"))
    return found


def test_ltx_dev_has_no_import_cycle():
    modules = {}
    for path in TOOLS.glob("ltx_dev/**/*.py"):
        name = ".".join(path.relative_to(TOOLS).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph = {name: {m for m in module_imports(path) if m in modules and m != name} for name, path in modules.items()}
    assert graph["ltx_dev.bench.render"] >= {"ltx_dev.bench.targets"}  # the check sees imports

    def visit(name, stack):
        assert name not in stack, f"import cycle: {' -> '.join([*stack, name])}"
        for child in graph[name]:
            visit(child, [*stack, name])

    for name in graph:
        visit(name, [])


def test_paths_follow_the_checkout_of_the_current_directory(tmp_path):
    """`ltx-dev ab` benchmarks its B side inside a copy of the tree: ltx_dev (installed from this checkout)
    must then load the copy's build, so its ROOT follows the current directory."""
    import subprocess

    (tmp_path / "build.toml").write_text((ROOT / "build.toml").read_text())
    (tmp_path / "sub").mkdir()
    found = subprocess.run([sys.executable, "-c", "from ltx_dev.paths import ROOT; print(ROOT)"],
                           cwd=tmp_path / "sub", capture_output=True, text=True, check=True).stdout.strip()
    assert Path(found) == tmp_path.resolve()


def test_host_cost_training_graph_calls_match_the_op_schemas(kernel):
    """Every call --training-graph times runs on meta tensors (the ops' fake kernels): the table keeps
    up with the schemas, and each op returns rows of the model's width."""
    import torch

    cases = host_cost.training_graph_cases(kernel.ops, device="meta")
    assert {"adaln_rmsnorm_fwd", "fused_norm_bwd adaln_rmsnorm", "qk_rmsnorm_rope_bwd"} <= set(cases)
    for name, call in cases.items():
        if name == "adaln_rmsnorm (out variant)":
            continue  # mutates its output: no fake result to look at
        out = call()
        first = next(t for t in (out if isinstance(out, (tuple, list)) else (out,)) if t is not None)
        assert isinstance(first, torch.Tensor) and first.device.type == "meta", name
        assert first.shape[-1] == 2048, name
