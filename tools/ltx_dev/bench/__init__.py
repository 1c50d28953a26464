"""The benchmark harness (`harness`: timing, the common command line, the JSON
record), how result rows are named (`rows`), the targets they are checked
against (`targets`), the end-to-end benchmark's model table and arithmetic
(`end_to_end`) and their rendering into README.md and docs/performance.md
(`render`). The benchmarks themselves are benchmarks/bench_<family>.py and
benchmarks/generate_video.py (end to end)."""

# The op families, as kernel_src/<family>/, the benchmarks (bench_<family>.py) and the result files name them.
FAMILIES = ("rmsnorm", "fused_norm", "layernorm", "activation", "rope", "qk_rmsnorm_rope", "rope_axes", "vae", "fp8")
