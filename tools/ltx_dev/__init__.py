"""ltx-kernels' development tools: `python3 -m ltx_dev <command>` (console script
`ltx-dev`; `ltx-dev --help` lists the commands). Also the modules tests,
benchmarks and the sanitizer share: `registry` (every exported op, described
once), `reference` (per op family), `bench` (the benchmark harness, rendering
and targets) and `tuning` (launch overrides of development builds)."""
