"""The backward row split (kernel_src/common/column_sum.cuh's wave split), compiled host-only with
the CUDA toolkit's nvcc and probed over row counts and group counts: no GPU needed."""

from __future__ import annotations

import subprocess

import pytest

from ltx_build import toolchain

from .conftest import ROOT

WAVE = 528  # column_sum_config::kWaveBlocks
MIN_ROWS, MAX_BLOCKS = 8, 1024  # column_sum_config::kMinRowsPerBlock, kMaxBlocks
# Row and group counts around the wave's edges (groups 0: a batch of 0).
PAIRS = [(r, g) for g in (0, 1, 2, 3, 7, 64, 527, 528, 529, 5000)
         for r in (0, 1, 7, 8, 9, 4223, 4225, 5376, 8447, 8448, 8449, 9001, 65520, 10**7)]


# The large problems' splits at rows of 192 words (Wan 1.3B), with their blocks over all groups.
WIDE_SPLITS = {"layernorm 192": 660, "layernorm seam 192": 528, "adaln_rmsnorm 192": 1056,
               "gated_residual_rmsnorm 192": 528, "adaln_layernorm 192": 660}


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """(rows, groups) pairs -> {pair: {split: rows per block}} with "blocks" (blocks per group of the
    default split), asserting that layernorm's and fused_norm's configs agree on each wave."""
    try:
        nvcc = toolchain.find_cuda_home() / "bin" / "nvcc"
    except Exception as e:  # noqa: BLE001 - no toolkit: nothing to compile with
        pytest.skip(f"no CUDA toolkit: {e}")
    exe = tmp_path_factory.mktemp("split") / "probe"
    subprocess.run([str(nvcc), "-std=c++17", "-O1", str(ROOT / "tests" / "data" / "row_split_probe.cu"), "-o",
                    str(exe)], check=True, capture_output=True, text=True)

    def run(pairs):
        text = "".join(f"{r} {g}\n" for r, g in pairs)
        out = subprocess.run([str(exe)], input=text, check=True, capture_output=True, text=True).stdout.split("\n")
        result = {}
        for (r, g), line in zip(pairs, out):
            per, per_ln, per_fn, seam_ln, seam_fn, modulated, blocks, *wide = map(int, line.split())
            assert per == per_ln == per_fn and seam_ln == seam_fn, (r, g, line)
            result[(r, g)] = {"default": per, "seam": seam_ln, "modulated": modulated, "blocks": blocks,
                              **dict(zip(WIDE_SPLITS, wide))}
        return result
    return run


@pytest.fixture(scope="module")
def split(probe):
    """(rows, groups) -> (rows per block, blocks per group) of the default split."""
    return lambda pairs: {k: (v["default"], v["blocks"]) for k, v in probe(pairs).items()}


def test_ltx_video_rows_fill_one_wave_and_flux_and_wan_keep_the_plain_split(split):
    got = split([(5376, 1), (2688, 2), (4096, 1), (65520, 1), (32760, 2), (8, 1)])
    assert got[(5376, 1)] == (11, 489)   # LTX-Video 2B: 672 blocks of 8 were 1.27 waves
    assert got[(2688, 2)] == (11, 245)   # the same rows split per batch: 490 blocks in all
    assert got[(4096, 1)] == (8, 512)    # Flux: already one wave
    assert got[(65520, 1)] == (64, 1024)  # Wan 1.3B: runs above the minimum, unchanged
    assert got[(32760, 2)] == (32, 1024)
    assert got[(8, 1)] == (8, 1)


def test_every_split_covers_its_rows_and_a_stretched_one_is_one_wave(split):
    for (rows, groups), (per, blocks) in split(PAIRS).items():
        plain = max(MIN_ROWS, -(-rows // MAX_BLOCKS))
        assert per >= plain, (rows, groups, per)
        assert blocks == (-(-rows // per) if rows > 0 else 0), (rows, groups, per, blocks)
        if per != plain:  # stretched: the plain split was one to two waves, now one
            wave = WAVE if groups < 1 else max(1, WAVE // groups)
            assert wave < -(-rows // plain) < 2 * wave and blocks <= wave, (rows, groups, per, blocks)


def test_the_seams_fill_their_two_an_sm_wave_and_modulated_rmsnorm_its_five(probe):
    got = probe([(5376, 1), (2688, 2), (4096, 1), (65520, 1)])
    assert got[(5376, 1)]["seam"] == 21      # 256 blocks: one wave at two an SM (264)
    assert got[(2688, 2)]["seam"] == 21      # 128 per batch
    assert got[(5376, 1)]["modulated"] == 9  # 598 blocks: one wave at five an SM (660)
    for pair in ((4096, 1), (65520, 1)):     # not stretched at four an SM: no op's split changes
        assert got[pair]["seam"] == got[pair]["modulated"] == got[pair]["default"], pair


@pytest.mark.parametrize("split_name, per_sm", [("seam", 2), ("modulated", 5)])
def test_an_op_wave_is_stretched_to_exactly_when_the_default_split_is(probe, split_name, per_sm):
    for (rows, groups), got in probe(PAIRS).items():
        plain = max(MIN_ROWS, -(-rows // MAX_BLOCKS))
        if got["default"] == plain:
            assert got[split_name] == plain, (rows, groups, got)
        else:
            wave = max(1, per_sm * WAVE // 4 // max(groups, 1))
            assert -(-rows // got[split_name]) <= wave, (rows, groups, got)


def test_wans_rows_take_each_ops_own_split_only_when_runs_pass_the_minimum(probe):
    got = probe([(65520, 1), (32760, 2), (5376, 1), (2688, 2), (8192, 1), (8193, 1)])
    assert got[(65520, 1)]["layernorm 192"] == 100             # 656 blocks: one wave at 5 an SM, not 1024 of 64
    assert got[(32760, 2)]["adaln_layernorm 192"] == 100       # 328 a batch, 656 in all, not 2048 of 32
    assert got[(32760, 2)]["layernorm seam 192"] == 125        # 263 a batch, 526 in all: 4 an SM, not 2048 of 32
    assert got[(32760, 2)]["adaln_rmsnorm 192"] == 63          # 520 a batch, 1040 in all
    assert got[(32760, 2)]["gated_residual_rmsnorm 192"] == 125
    for pair in ((5376, 1), (2688, 2), (8192, 1)):              # runs of the minimum, or stretched: as before
        assert got[pair]["layernorm 192"] == got[pair]["adaln_rmsnorm 192"] == got[pair]["default"], pair
        assert got[pair]["adaln_layernorm 192"] == got[pair]["default"], pair
        assert got[pair]["layernorm seam 192"] == got[pair]["gated_residual_rmsnorm 192"] == got[pair]["seam"], pair
    assert got[(8193, 1)]["layernorm 192"] == 13               # 9 rows at 1024 blocks: past the minimum


def test_a_large_problems_split_covers_its_rows_in_at_most_its_blocks(probe):
    for (rows, groups), got in probe(PAIRS).items():
        plain = max(MIN_ROWS, -(-rows // MAX_BLOCKS))
        if plain == MIN_ROWS:
            continue
        for name, blocks in WIDE_SPLITS.items():
            per, per_group = got[name], max(1, blocks // max(groups, 1))
            assert -(-rows // per) <= per_group and per >= plain, (rows, groups, name, per)
