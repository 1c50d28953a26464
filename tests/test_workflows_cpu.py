"""The GitHub Actions workflows (.github/workflows, docs/release.md): actionlint (with
shellcheck on every `run:` script) finds nothing; CI runs the README's test command; the
release matrix is every CUDA variant of the pinned kernel-builder on x86_64 and aarch64
Linux; the publish job signs every metadata.json where kernels looks for the bundle, checks
it, and only then uploads with the HF_TOKEN secret."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ltx_build import config as build_config
from ltx_dev import release

from .conftest import ROOT

WORKFLOWS = ROOT / ".github" / "workflows"
PINNED = json.loads((ROOT / "tools" / "ltx_build" / "pinned-build-variants.json").read_text())
PY_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tools"), os.environ.get("PYTHONPATH", "")]))


def tool(name: str) -> str:
    """A dev-extra binary: beside this Python (a pip install's scripts) or on PATH."""
    found = shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if found is None:
        pytest.fail(f"{name} is missing: pip install 'tools[dev]' (tools/pyproject.toml pins it)")
    return found


def actionlint(*files: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    # -shellcheck given explicitly: without it actionlint silently skips the scripts
    # when shellcheck is not on PATH.
    return subprocess.run([tool("actionlint"), "-no-color", "-shellcheck", tool("shellcheck"), *map(str, files)],
                          cwd=cwd, capture_output=True, text=True)


def workflow(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def triggers(wf: dict) -> dict:
    return wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` key as True


def step_index(steps: list[dict], needle: str) -> int:
    hits = [i for i, s in enumerate(steps) if needle in s.get("run", "")]
    assert len(hits) == 1, f"{needle!r} in {len(hits)} steps"
    return hits[0]


def matrix_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ltx_dev.release", "matrix", *args],
                          capture_output=True, text=True, env=PY_ENV, cwd=ROOT)


def outputs(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines())


# --- actionlint ---------------------------------------------------------------------------------

def test_actionlint_and_shellcheck_find_nothing_in_the_workflows():
    files = sorted([*WORKFLOWS.glob("*.yml"), *WORKFLOWS.glob("*.yaml")])
    assert {"ci.yml", "release.yml"} <= {f.name for f in files}
    r = actionlint(*files)
    assert r.returncode == 0, f"actionlint:\n{r.stdout}{r.stderr}"


def test_actionlint_reports_script_and_expression_problems(tmp_path):
    # Guards the test above against a linter that checks nothing.
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n"
                   "      - run: echo $X ${{ github.event.head_commit.message }}\n")
    r = actionlint(bad, cwd=tmp_path)
    assert r.returncode == 1
    assert "SC2086" in r.stdout and "potentially untrusted" in r.stdout


# --- ci.yml -------------------------------------------------------------------------------------

def test_ci_runs_the_readme_test_command_on_every_push_and_pr_with_nvcc_13_0_and_python_3_11():
    wf = workflow("ci.yml")
    assert set(triggers(wf)) == {"push", "pull_request"}
    (job,) = wf["jobs"].values()
    steps = job["steps"]
    run = [i for i, s in enumerate(steps) if s.get("run", "").strip() == "bash .ci/run"]
    assert len(run) == 1
    assert step_index(steps, "cuda-toolkit-13-0") < run[0]
    assert job["env"]["CUDA_HOME"] == "/usr/local/cuda-13.0"
    (python,) = [s for s in steps if s.get("uses", "").startswith("actions/setup-python@")]
    assert python["with"]["python-version"] == "3.11"
    assert wf["permissions"] == {"contents": "read"}


# --- the release matrix -------------------------------------------------------------------------

def test_release_matrix_is_every_cuda_variant_of_the_pin_on_both_linux_systems():
    r = matrix_cli("--tag", "v1.0.0")
    assert r.returncode == 0, r.stderr
    out = outputs(r.stdout)
    entries = json.loads(out["matrix"])["include"]
    want = {(v, s) for s in ("x86_64-linux", "aarch64-linux") for v in PINNED[s]["cuda"]}
    assert {(e["variant"], e["system"]) for e in entries} == want
    assert len(entries) == int(out["count"]) == 12  # torch212/213 x cu126/130/132 x 2 systems
    assert sorted(json.loads(out["variants"])) == sorted(v for v, _ in want)
    assert out["version"] == str(build_config.load(ROOT).version)
    for e in entries:
        # the GPU tests run where a Hopper runner exists; aarch64 builds on GitHub's Arm runner
        on_x86 = e["system"] == "x86_64-linux"
        assert e["gpu_test"] is on_x86
        assert e["runner"] == (release.GPU_RUNNER if on_x86 else "ubuntu-24.04-arm")


def test_release_matrix_takes_the_x86_64_runner_from_its_option():
    def x86(value):
        r = matrix_cli("--gpu-runner", value)
        assert r.returncode == 0, r.stderr
        entries = json.loads(outputs(r.stdout)["matrix"])["include"]
        return {(json.dumps(e["runner"]), e["gpu_test"]) for e in entries if e["system"] == "x86_64-linux"}

    assert x86("") == {(json.dumps(release.GPU_RUNNER), True)}
    assert x86("my-h100") == {('"my-h100"', True)}
    assert x86('["self-hosted", "gpu"]') == {('["self-hosted", "gpu"]', True)}
    assert x86("none") == {('"ubuntu-24.04"', False)}  # no Hopper runner: build-only


@pytest.mark.parametrize("tag, major", [("v1", 1), ("v1.2.3", 1), ("v10.0.0-rc1", 10)])
def test_tag_major(tag, major):
    assert release.tag_major(tag) == major


def test_release_matrix_refuses_a_tag_whose_major_is_not_the_hub_version():
    r = matrix_cli("--tag", "v2.0.0")
    assert r.returncode == 1 and "build.toml has version = 1" in r.stderr
    with pytest.raises(ValueError):
        release.tag_major("1.0.0")


def test_release_matrix_refuses_a_flake_whose_variants_are_not_the_pinned_ones(tmp_path):
    x86 = tmp_path / "x86.json"
    arm = tmp_path / "arm.json"
    arm.write_text(json.dumps(PINNED["aarch64-linux"]["cuda"]))
    x86.write_text(json.dumps(PINNED["x86_64-linux"]["cuda"]))
    assert matrix_cli("--nix", f"x86_64-linux={x86}", "--nix", f"aarch64-linux={arm}").returncode == 0
    x86.write_text(json.dumps(PINNED["x86_64-linux"]["cuda"][1:] + ["torch214-cxx11-cu130-x86_64-linux"]))
    r = matrix_cli("--nix", f"x86_64-linux={x86}", "--nix", f"aarch64-linux={arm}")
    assert r.returncode == 1
    assert PINNED["x86_64-linux"]["cuda"][0] in r.stderr and "torch214-cxx11-cu130-x86_64-linux" in r.stderr


def test_release_workflow_builds_and_tests_each_matrix_entry_and_uploads_its_variant_directory():
    wf = workflow("release.yml")
    assert triggers(wf) == {"push": {"tags": ["v*"]}}
    matrix_steps = wf["jobs"]["matrix"]["steps"]
    gen = matrix_steps[step_index(matrix_steps, "ltx_dev.release matrix")]["run"]
    assert "--nix \"x86_64-linux=" in gen and "--nix \"aarch64-linux=" in gen and '--tag "$TAG"' in gen
    build = wf["jobs"]["build"]
    assert build["strategy"]["matrix"] == "${{ fromJSON(needs.matrix.outputs.matrix) }}"
    assert build["runs-on"] == "${{ matrix.runner }}"
    steps = build["steps"]
    assert 'nix build -L ".#redistributable.$VARIANT"' in steps[step_index(steps, "redistributable")]["run"]
    ci_test = steps[step_index(steps, "ciTests")]
    assert ci_test["run"] == 'nix run -L ".#ciTests.$VARIANT"' and ci_test["if"] == "matrix.gpu_test"
    (upload,) = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert upload["with"]["name"] == "${{ matrix.variant }}"
    assert upload["with"]["path"] == "build/${{ matrix.variant }}/"


def test_every_nix_job_uses_the_hugging_face_binary_cache():
    jobs = workflow("release.yml")["jobs"]
    for name, job in jobs.items():
        uses = [s.get("uses", "").split("@")[0] for s in job["steps"]]
        assert "DeterminateSystems/nix-installer-action" in uses, name
        (cachix,) = [s for s in job["steps"] if s.get("uses", "").startswith("cachix/cachix-action@")]
        assert cachix["with"] == {"name": "huggingface"}, name


# --- signing and upload -------------------------------------------------------------------------

def test_publish_signs_and_verifies_every_metadata_json_before_uploading_with_the_secret():
    text = (WORKFLOWS / "release.yml").read_text()
    wf = yaml.safe_load(text)
    assert wf["permissions"] == {}
    assert wf["concurrency"]["cancel-in-progress"] is False
    job = wf["jobs"]["publish"]
    assert set(job["needs"]) == {"matrix", "build"}
    assert job["permissions"] == {"contents": "read", "id-token": "write"}
    assert all("id-token" not in j.get("permissions", {}) for n, j in wf["jobs"].items() if n != "publish")
    steps = job["steps"]
    sign = steps[step_index(steps, "cosign sign-blob")]["run"]
    assert "files=(build/*/metadata.json)" in sign and '--bundle "$f.sigstore" "$f"' in sign
    assert '"${#files[@]}" -ne "$COUNT"' in sign  # every variant of the matrix, none missing
    verify = step_index(steps, "ltx_dev.release verify build")
    upload = step_index(steps, "kernel-builder#kernel-builder -- upload")
    assert step_index(steps, "cosign sign-blob") < verify < upload
    assert '--repo-type kernel --branch "$BRANCH"' in steps[upload]["run"]
    assert steps[upload]["env"] == {"HF_TOKEN": "${{ secrets.HF_TOKEN }}",
                                    "BRANCH": "v${{ needs.matrix.outputs.version }}"}
    assert text.count("secrets.") == 1  # the token reaches that one step and nothing else


def test_the_signer_identity_is_this_repositorys_release_workflow_at_the_tag():
    assert (ROOT / release.WORKFLOW).is_file()
    uri = release.signer_uri("org/ltx-kernels", "refs/tags/v1.0.0")
    assert uri == "https://github.com/org/ltx-kernels/.github/workflows/release.yml@refs/tags/v1.0.0"
    pol = release.policy("org/ltx-kernels", "refs/tags/v1.0.0")
    assert (pol.repo_id, pol.signer_uris) == ("org/ltx-kernels", [uri])


def test_verify_reads_the_bundle_where_the_workflow_writes_it(tmp_path):
    # The workflow writes <variant>/metadata.json.sigstore; kernels must look there.
    variant = tmp_path / "torch213-cxx11-cu130-x86_64-linux"
    variant.mkdir()
    (variant / "metadata.json").write_text('{"name": "ltx-kernels"}')

    def verify(*extra):
        return subprocess.run([sys.executable, "-m", "ltx_dev.release", "verify", str(tmp_path), "--repo", "o/n",
                               "--ref", "refs/tags/v1.0.0", *extra], capture_output=True, text=True, env=PY_ENV)

    r = verify()
    assert r.returncode == 1 and f"FAIL {variant.name}: no metadata.json.sigstore" in r.stdout
    (variant / "metadata.json.sigstore").write_text("{}")
    r = verify("--expect", json.dumps([variant.name, "torch212-cxx11-cu126-aarch64-linux"]))
    assert r.returncode == 1 and "SignatureBundleInvalid" in r.stdout
    assert "missing variants: ['torch212-cxx11-cu126-aarch64-linux']" in r.stderr
