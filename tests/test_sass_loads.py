"""The vectorized kernels read global memory only in 8- or 16-byte loads.

nvcc twice turned a 16-byte read into four 32-bit loads when the word was
indexed in place and handed by reference to code that views it as pairs or
elements (adaln exact 13.5 vs 11.8 us,
qk_rmsnorm_rope 44.1 vs 37.7 us on the H200). Results stay bitwise the same,
so only the machine code shows it: this test reads the SASS of the built
library with cuobjdump (the dev extra of tools/pyproject.toml). Needs no GPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

# Kernels that move whole 16-byte words; the scalar fallbacks, the broadcasting
# adds and the table kernel legitimately read single elements.
WORD_KERNELS = re.compile(r"_vectorized|head_words|residual_flat")
# Word kernels that also read single elements on purpose, and how many such loads each may have:
# head_gate and its backward read the head's logit (one per head, not a row of words); the norm
# backwards read the forward's saved per-row statistics (rmsnorm's rstd; layernorm's mean and rstd).
SCALAR_READS = {"head_gate_vectorized": 1, "head_gate_bwd_vectorized": 1, "rmsnorm_bwd_vectorized": 1,
                "layernorm_bwd_vectorized": 2}
WIDE_LOAD = re.compile(r"LDG[.A-Z]*\.(128|64)\b")  # LDGSTS.E.BYPASS.128: a cp.async copy of a word
LOAD = re.compile(r"\bLDG(?!DEPBAR)")  # LDGDEPBAR commits cp.async copies: no load


def cuda_tool(name: str) -> Path | None:
    for entry in sys.path:
        candidate = Path(entry) / "nvidia" / "cu13" / "bin" / name
        if candidate.is_file():
            return candidate
    return None


def built_library() -> Path:
    from ltx_build import variant

    libs = sorted((ROOT / "build" / variant.current_variant()).glob("_ltx_kernels_cuda_*.so"))
    if not libs:
        pytest.fail("no built library: run `python3 -m ltx_build build` first")
    return libs[0]


def narrow_loads_per_kernel(sass: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    kernel = None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            kernel = m.group(1)
            continue
        if kernel and WORD_KERNELS.search(kernel) and LOAD.search(line) and not WIDE_LOAD.search(line):
            counts[kernel] = counts.get(kernel, 0) + 1
    return counts


def test_narrow_load_finder_tells_split_words_from_whole_ones():
    sass = """
        Function : _ZN3ltx5fused21fused_norm_vectorizedIfEEvv
        /*0100*/  LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0110*/  LDG.E R8, desc[UR4][R2.64+0x4] ;
        /*0120*/  LDGSTS.E.BYPASS.128 [R7], desc[UR18][R2.64] ;
        /*0130*/  LDGDEPBAR ;
        Function : _ZN3ltx5fused17fused_norm_scalarIfEEvv
        /*0100*/  LDG.E.U16 R4, desc[UR4][R2.64] ;
        Function : qk_norm_rope_head_wordsI
        /*0100*/  LDG.E.64 R4, desc[UR4][R2.64] ;
    """
    assert narrow_loads_per_kernel(sass) == {"_ZN3ltx5fused21fused_norm_vectorizedIfEEvv": 1}


def test_vectorized_kernels_have_no_split_global_loads():
    cuobjdump, nvdisasm = cuda_tool("cuobjdump"), cuda_tool("nvdisasm")
    if cuobjdump is None or nvdisasm is None:
        pytest.skip("cuobjdump/nvdisasm not installed (pip install -e 'tools[dev]')")
    env = dict(os.environ, PATH=f"{nvdisasm.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    sass = subprocess.run([str(cuobjdump), "-sass", str(built_library())], env=env, check=True,
                          capture_output=True, text=True).stdout
    assert "Function : " in sass and "_vectorized" in sass, "no SASS found in the library"
    narrow = {kernel: count for kernel, count in narrow_loads_per_kernel(sass).items()
              if count > max((n for name, n in SCALAR_READS.items() if name in kernel), default=0)}
    worst = sorted(narrow.items(), key=lambda kv: -kv[1])[:5]
    assert not narrow, f"{len(narrow)} word kernels with 32-bit or narrower global loads, e.g. {worst}"
