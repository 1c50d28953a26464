"""Bundles for the publishing and metadata tests, without compiling: a copy of
this checkout's package, card and benchmarks, and build/<variant>/ directories
as ltx_build installs them (layout.install_variant with a stand-in .so) or as
kernel-builder's Nix build leaves them (its provenance and digest)."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from ltx_build import config, layout, variant

from .conftest import CFG, ROOT

VARIANT = "torch214-cxx11-cu130-x86_64-linux"
# What the pinned kernel-builder (huggingface/kernels 8ac69fc, kernel-builder/Cargo.toml line 3)
# records, in the shape of kernels-data/src/metadata.rs (Provenance, lines 67-79).
NIX_PROVENANCE = {"kernel-builder": {"version": "0.17.0-dev0", "commit": "a" * 40, "dirty": False},
                  "kernel": {"commit": "b" * 40, "dirty": False}}


@functools.cache
def stand_in_library() -> bytes:
    """An empty shared object, compiled once: never loaded, but the ABI check
    that `upload` runs can read it (and finds nothing)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, so = Path(tmp) / "stand_in.c", Path(tmp) / "stand_in.so"
        src.write_text("int ltx_stand_in;\n")
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
        return so.read_bytes()


def checkout_copy(tmp_path: Path) -> Path:
    """A repository root with this checkout's build.toml, card, package and
    benchmarks (plus a script that is not a kernels benchmark)."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("build.toml", "CARD.md"):
        shutil.copy(ROOT / name, root / name)
    shutil.copytree(ROOT / "torch-ext" / CFG.python_name, root / "torch-ext" / CFG.python_name,
                    ignore=shutil.ignore_patterns("__pycache__", "_ops.py"))
    (root / "benchmarks").mkdir()
    shutil.copy(ROOT / "benchmarks" / "benchmark.py", root / "benchmarks" / "benchmark.py")
    (root / "benchmarks" / "bench_rmsnorm.py").write_text("# not a kernels benchmark: not uploaded\n")
    return root


def assemble(root: Path, name: str = VARIANT, git: variant.GitState | None = None,
             ops_name: str = "_ltx_kernels_cuda_abcdef0") -> Path:
    """build/<name>/ as `ltx-build build` installs it, from `root`'s package
    and a stand-in shared object; returns the variant directory."""
    cfg = config.load(root)
    so = root / "_build" / name / f"{ops_name}.abi3.so"
    so.parent.mkdir(parents=True, exist_ok=True)
    so.write_bytes(stand_in_library())
    meta = layout.metadata(cfg, ops_name, cfg.capabilities, layout.provenance(git))
    variant_dir = root / "build" / name
    layout.install_variant(cfg, variant_dir, so, ops_name, meta)
    return variant_dir


def write_variant(root: Path, name: str, meta: dict, nix: bool = True) -> Path:
    """build/<name>/ with an __init__.py, a stand-in .so, bytecode, and `meta`;
    with `nix`, also the provenance and digest kernel-builder's Nix build writes."""
    variant_dir = root / "build" / name
    (variant_dir / "__pycache__").mkdir(parents=True)
    (variant_dir / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"")
    (variant_dir / "__init__.py").write_text("")
    (variant_dir / f"{meta['id']}.abi3.so").write_bytes(stand_in_library())
    if nix:
        meta = {**meta, "digest": layout.digest(variant_dir), "provenance": NIX_PROVENANCE}
    (variant_dir / "metadata.json").write_text(json.dumps(meta))
    return variant_dir
