"""Command line: ltx-build (= python3 -m ltx_build) [build|variant|clean|jit|info|card|upload] ..."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from . import BuildError, commands, config

DESCRIPTION = """\
Build ltx-kernels for the torch installed in this Python, without Nix.

Writes build/<variant>/ (variant named as `kernels` expects, e.g.
torch214-cxx11-cu130-x86_64-linux) with __init__.py, _ops.py, the
_ltx_kernels_cuda_<id>.abi3.so and metadata.json: the layout of
`nix run .#build-and-copy`. Compiles in parallel and only what changed,
then checks the ABI (manylinux_2_28, abi3) and loads the result through
`kernels.get_local_kernel` and `kernels.get_kernel` (LOCAL_KERNELS, offline).
Runs from any directory of the checkout (or pass --root).
"""


def main(argv: list[str] | None = None) -> int:
    # --root is accepted before and after the subcommand; SUPPRESS keeps the
    # subcommand's absent option from overwriting one given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--root", type=Path, default=argparse.SUPPRESS,
                        help="repository root (default: the checkout around the current directory, else the one "
                             "this tool is installed from)")
    compiling = argparse.ArgumentParser(add_help=False)
    compiling.add_argument("-j", "--jobs", type=int, default=None, help="parallel compile jobs (default: CPU count)")
    compiling.add_argument("-v", "--verbose", action="store_true", help="print every compiler command and why it runs")
    dev = argparse.ArgumentParser(add_help=False)
    dev.add_argument("--dev", action="store_true",
                     help="development build: -DLTX_KERNELS_DEV (test probe ops, A/B-only kernels), its own op "
                          "namespace, installed into _build/dev/build/<variant>/ (never build/)")

    parser = argparse.ArgumentParser(prog="ltx-build", description=DESCRIPTION, parents=[common],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    b = sub.add_parser("build", parents=[common, compiling, dev],
                       help="compile, install build/<variant>/, check (the default command)")
    b.add_argument("--no-check", action="store_true", help="skip the ABI and load checks")
    b.add_argument("--allow-newer-glibc", action="store_true",
                   help="report manylinux_2_28 violations as warnings (local builds on hosts with glibc > 2.28)")
    sub.add_parser("variant", parents=[common, dev], help="print the variant name and op namespace, build nothing")
    sub.add_parser("clean", parents=[common], help="remove build/ and the object cache _build/ (dev builds too)")
    commands.add_parsers(sub, b, common=[common], jit=[common, compiling, dev])
    args = parser.parse_args(argv)
    try:
        root = args.root.resolve() if getattr(args, "root", None) else config.find_root()
        handled = commands.run(args, root)
        if handled is not None:
            return handled
        if args.command == "variant":
            from . import variant
            uid = variant.unique_id(root) + ("_dev" if args.dev else "")
            print(variant.current_variant())
            print(variant.ops_namespace(config.load(root).python_name, "cuda", uid))
            return 0
        if args.command == "clean":
            for d in ("build", "_build"):
                shutil.rmtree(root / d, ignore_errors=True)
            print("removed build/ and _build/")
            return 0
        from .build import build, check
        result = build(root, jobs=getattr(args, "jobs", None), verbose=getattr(args, "verbose", False),
                       dev=getattr(args, "dev", False))
        if not getattr(args, "no_check", False):
            check(root, result, allow_newer_glibc=getattr(args, "allow_newer_glibc", False))
        return 0
    except BuildError as e:
        print(f"ltx_build: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
