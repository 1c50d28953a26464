"""Subcommands beyond build/variant/clean: the variant matrix (``build
--all-variants``), the compile-on-first-use cache (``jit``), ``info``, ``card``
and ``upload``. __main__ registers them with :func:`add_parsers` and hands
them to :func:`run`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import BuildError, config


def add_parsers(sub: argparse._SubParsersAction, build_parser: argparse.ArgumentParser, *,
                common: list[argparse.ArgumentParser], jit: list[argparse.ArgumentParser]) -> None:
    build_parser.add_argument("--all-variants", action="store_true",
                              help="build every variant of ltx_build/variants.toml, each in its own environment "
                                   "created from the package indexes (default: only the installed torch)")
    build_parser.add_argument("--variant-label", action="append", default=[], metavar="LABEL",
                              help="with --all-variants: only this variant of the matrix (repeatable)")
    build_parser.add_argument("--cuda-home", action="append", default=[], metavar="LABEL=DIR",
                              help="with --all-variants: build variant LABEL with the CUDA toolkit at DIR")

    j = sub.add_parser("jit", parents=jit, help="bring the compile-on-first-use cache up to date (what "
                                                "ltx_build.jit.load_kernel() loads), print where it is")
    j.add_argument("--print-cache-dir", action="store_true", help="only print the cache directory")

    i = sub.add_parser("info", parents=common, help="print kernel_info(): ops, variant, archs, GPU, what runs here")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.add_argument("--source-tree", action="store_true",
                   help="load the source tree compiled on first use (ltx_build.jit) instead of build/")
    i.add_argument("--dev", action="store_true", help="the development build (_build/dev/build/) instead of build/")

    sub.add_parser("card", parents=common, help="render CARD.md into build/CARD.md (the Hub repository's README.md)")

    u = sub.add_parser("upload", parents=common,
                       help="upload build/ to the Hub: card to main, variants and benchmarks to v<version>")
    u.add_argument("--dry-run", action="store_true", help="print which file goes where, send nothing")
    u.add_argument("--repo-id", help="Hub repository (default: [general.hub] repo-id of build.toml)")
    u.add_argument("--branch", help="version branch (default: v<version> of build.toml)")
    u.add_argument("--private", action="store_true", help="create the repository as private")
    u.add_argument("--allow-dirty", action="store_true", help="upload variants built from uncommitted changes")
    u.add_argument("--allow-non-nix-build", action="store_true",
                   help="upload variants not built by kernel-builder's Nix build (ltx-build's own): not "
                        "manylinux_2_28-built nor reproducible; publish with the release workflow instead")


def run(args: argparse.Namespace, root: Path) -> int | None:
    """Handle ``args`` when it is one of these commands; None otherwise."""
    if args.command == "build" and getattr(args, "all_variants", False):
        if args.dev:
            raise BuildError("--dev builds the installed torch's variant only; drop --all-variants")
        return _all_variants(args, root)
    if args.command == "jit":
        return _jit(args, root)
    if args.command == "info":
        return _info(args, root)
    if args.command == "card":
        from . import card

        print(f"ltx_build: wrote {card.write(root)}")
        return 0
    if args.command == "upload":
        return _upload(args, root)
    return None


def _all_variants(args: argparse.Namespace, root: Path) -> int:
    from . import variants

    specs = variants.load_matrix()
    if args.variant_label:
        unknown = set(args.variant_label) - {s.label for s in specs}
        if unknown:
            raise BuildError(f"no variant labelled {', '.join(sorted(unknown))} in {variants.MATRIX.name} "
                             f"(labels: {', '.join(s.label for s in specs)})")
        specs = [s for s in specs if s.label in args.variant_label]
    homes = {}
    for item in args.cuda_home:
        label, sep, path = item.partition("=")
        if not sep:
            raise BuildError(f"--cuda-home takes LABEL=DIR, got {item!r}")
        homes[label] = Path(path).resolve()
    results = variants.build_all(root, specs, cuda_homes=homes, jobs=args.jobs,
                                 allow_newer_glibc=args.allow_newer_glibc)
    print(variants.report(results))
    return 0 if all(r.ok for r in results) else 1


def _jit(args: argparse.Namespace, root: Path) -> int:
    from . import jit

    if args.print_cache_dir:
        print(jit.cache_root() / config.load(root).python_name)
        return 0
    with jit.cached_build(root, dev=args.dev, log=print) as plan:
        print(f"ltx_build: {plan.variant_dir} is up to date")
    return 0


def _info(args: argparse.Namespace, root: Path) -> int:
    import importlib

    import kernels

    if args.source_tree:
        from . import jit

        package = jit.load_kernel(root, dev=args.dev)
    else:
        from .build import flavour_dir

        base = flavour_dir(root, args.dev)
        try:
            package = kernels.get_local_kernel(base)
        except (FileNotFoundError, OSError) as e:
            raise BuildError(f"no variant of {base / 'build'} loads here ({e}); run `ltx-build build"
                             f"{' --dev' if args.dev else ''}`, or pass --source-tree") from None
    info = importlib.import_module(f"{package.__name__}.info").kernel_info()
    print(json.dumps(info.to_dict(), indent=2) if args.json else info.report())
    return 0


def _upload(args: argparse.Namespace, root: Path) -> int:
    from . import upload

    plan = upload.make_plan(root, repo_id=args.repo_id, branch=args.branch, allow_dirty=args.allow_dirty,
                            allow_non_nix=args.allow_non_nix_build)
    print(plan.describe(root))
    if plan.problems:
        print("problems (an upload would stop here):\n  " + "\n  ".join(plan.problems))
    for warning in plan.warnings:
        print(warning, file=sys.stderr, flush=True)
    if args.dry_run:
        print("dry run: nothing was sent")
        return 1 if plan.problems else 0
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise BuildError("HF_HUB_OFFLINE=1: uploading needs the Hub; use --dry-run to see the plan")
    from huggingface_hub import HfApi

    for url in upload.upload(plan, HfApi(library_name="ltx_build"), private=args.private):
        print(f"ltx_build: committed {url}")
    return 0
