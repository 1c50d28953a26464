"""Command line: python3 -m ltx_build [build|variant|clean] ..."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from . import BuildError, commands

DESCRIPTION = """\
Build ltx-kernels for the torch installed in this Python, without Nix.

Writes build/<variant>/ (variant named as `kernels` expects, e.g.
torch214-cxx11-cu130-x86_64-linux) with __init__.py, _ops.py, the
_ltx_kernels_cuda_<id>.abi3.so and metadata.json: the layout of
`nix run .#build-and-copy`. Compiles in parallel and only what changed,
then checks the ABI (manylinux_2_28, abi3) and loads the result through
`kernels.get_local_kernel` and `kernels.get_kernel` (LOCAL_KERNELS, offline).
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m ltx_build", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."), help="repository root (default: .)")
    sub = parser.add_subparsers(dest="command")
    b = sub.add_parser("build", help="compile, install build/<variant>/, check (the default command)")
    b.add_argument("-j", "--jobs", type=int, default=None, help="parallel compile jobs (default: CPU count)")
    b.add_argument("-v", "--verbose", action="store_true", help="print every compiler command")
    b.add_argument("--no-check", action="store_true", help="skip the ABI and load checks")
    b.add_argument("--allow-newer-glibc", action="store_true",
                   help="report manylinux_2_28 violations as warnings (local builds on hosts with glibc > 2.28)")
    sub.add_parser("variant", help="print the variant name and op namespace, build nothing")
    sub.add_parser("clean", help="remove build/ and the object cache _build/")
    commands.add_parsers(sub, b)
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        handled = commands.run(args, root)
        if handled is not None:
            return handled
        if args.command == "variant":
            from . import config, variant
            cfg = config.load(root)
            print(variant.current_variant())
            print(variant.ops_namespace(cfg.python_name, "cuda", variant.unique_id(root)))
            return 0
        if args.command == "clean":
            for d in ("build", "_build"):
                shutil.rmtree(root / d, ignore_errors=True)
            print("removed build/ and _build/")
            return 0
        from .build import build, check
        result = build(root, jobs=getattr(args, "jobs", None), verbose=getattr(args, "verbose", False))
        rebuilt = ", ".join(result.rebuilt) if result.rebuilt else "nothing (all up to date)"
        print(f"ltx_build: compiled {rebuilt} in {result.seconds:.1f} s", flush=True)
        if not getattr(args, "no_check", False):
            check(root, result, allow_newer_glibc=getattr(args, "allow_newer_glibc", False))
        return 0
    except BuildError as e:
        print(f"ltx_build: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
