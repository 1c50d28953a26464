"""The benchmark harness (`harness`: timing, the common command line, the JSON
record), how result rows are named (`rows`), the targets they are checked
against (`targets`) and their rendering into README.md and
docs/performance.md (`render`). The benchmarks themselves are
benchmarks/bench_<family>.py."""

# The op families, as kernel_src/<family>/, the benchmarks (bench_<family>.py) and the result files name them.
FAMILIES = ("rmsnorm", "fused_norm", "layernorm", "activation", "rope", "qk_rmsnorm_rope", "rope_axes", "vae")
