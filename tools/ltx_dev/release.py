"""The release workflow's helpers (.github/workflows/release.yml; docs/release.md):

  python3 -m ltx_dev.release matrix [--tag vN.x.y] [--nix SYSTEM=FILE ...] [--gpu-runner LABEL]
      The build matrix: one entry per variant of the pinned kernel-builder
      (tools/ltx_build/pinned-build-variants.json) for build.toml's backends on
      x86_64-linux and aarch64-linux. Prints `key=value` lines for $GITHUB_OUTPUT.
      --tag refuses a tag whose major is not build.toml's version (the Hub branch).
      --nix FILE holds the flake's `redistributable` attribute names for SYSTEM
      (`nix eval --json .#redistributable --apply builtins.attrNames --system SYSTEM`):
      a difference from the pinned list means flake.lock and the JSON disagree.

  python3 -m ltx_dev.release verify (BUILD_DIR | --hub REPO_ID --version N) --repo OWNER/NAME --ref REF
      Checks every build/<variant>/ the way `kernels` does (sigstore bundle
      metadata.json.sigstore, then the digest of every file) against the identity
      of this repository's release workflow run for REF (e.g. refs/tags/v1.0.0).
      `kernels verify-signature` itself only accepts kernels-community's workflows.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from importlib import resources
from pathlib import Path

from ltx_build import config as build_config

from .paths import ROOT

WORKFLOW = ".github/workflows/release.yml"  # the file whose runs sign releases
OIDC_ISSUER = "https://token.actions.githubusercontent.com"
# GitHub's hosted Arm runner; GitHub has no hosted Hopper GPU (its GPU runners are T4,
# sm_75), so x86_64 entries go to a self-hosted runner that can run the sm_90 tests.
ARM_RUNNER = "ubuntu-24.04-arm"
GPU_RUNNER = ["self-hosted", "linux", "x64", "h100"]
X86_RUNNER = "ubuntu-24.04"  # with --gpu-runner none: x86_64 builds there, untested
SYSTEMS = ("x86_64-linux", "aarch64-linux")


def pinned_variants() -> dict:
    return json.loads(resources.files("ltx_build").joinpath("pinned-build-variants.json").read_text())


def release_variants(backends, pinned: dict | None = None) -> dict[str, list[str]]:
    """{system: sorted variants} for the given backends on SYSTEMS."""
    pinned = pinned_variants() if pinned is None else pinned
    return {system: sorted(v for b in backends for v in pinned.get(system, {}).get(b, [])) for system in SYSTEMS}


def tag_major(tag: str) -> int:
    m = re.fullmatch(r"v(\d+)(?:[.-].*)?", tag)
    if not m:
        raise ValueError(f"release tag {tag!r} is not v<major>[.<minor>...]")
    return int(m.group(1))


def parse_runner(text: str):
    """A runs-on value: a JSON list of labels, or one label; empty means GPU_RUNNER,
    "none" means no GPU runner (None)."""
    text = text.strip()
    if not text:
        return GPU_RUNNER
    if text == "none":
        return None
    return json.loads(text) if text.startswith("[") else text


def matrix(variants: dict[str, list[str]], gpu_runner=GPU_RUNNER) -> dict:
    """gpu_runner None: every entry build-only, x86_64 on X86_RUNNER."""
    include = []
    for system in SYSTEMS:
        # only on x86_64 can a runner with a Hopper GPU run ci-test
        gpu = system == "x86_64-linux" and gpu_runner is not None
        runner = gpu_runner if gpu else ARM_RUNNER if system == "aarch64-linux" else X86_RUNNER
        for variant in variants[system]:
            include.append({"variant": variant, "system": system, "gpu_test": gpu, "runner": runner})
    return {"include": include}


def nix_mismatches(expected: dict[str, list[str]], nix: dict[str, list[str]]) -> list[str]:
    out = []
    for system, names in nix.items():
        want, got = set(expected.get(system, [])), set(names)
        if want != got:
            out.append(f"{system}: only pinned {sorted(want - got)}, only in the flake {sorted(got - want)}")
    return out


def cmd_matrix(args) -> int:
    cfg = build_config.load(args.root)
    if args.tag is not None and tag_major(args.tag) != cfg.version:
        print(f"error: tag {args.tag} is major {tag_major(args.tag)}, but build.toml has version = {cfg.version} "
              f"(uploads go to branch v{cfg.version}); tag v{cfg.version}.x.y or bump build.toml", file=sys.stderr)
        return 1
    variants = release_variants(cfg.backends)
    nix = {}
    for item in args.nix:
        system, _, file = item.partition("=")
        nix[system] = json.loads(Path(file).read_text())
    bad = nix_mismatches(variants, nix)
    if bad:
        print("error: the flake's variants are not tools/ltx_build/pinned-build-variants.json's; copy "
              "nix-builder/build-variants.json of the kernel-builder rev in flake.lock over it:\n  "
              + "\n  ".join(bad), file=sys.stderr)
        return 1
    every = [v for system in SYSTEMS for v in variants[system]]
    print(f"matrix={json.dumps(matrix(variants, parse_runner(args.gpu_runner)), separators=(',', ':'))}")
    print(f"variants={json.dumps(every, separators=(',', ':'))}")
    print(f"count={len(every)}")
    print(f"version={cfg.version}")
    return 0


def signer_uri(repo: str, ref: str) -> str:
    """The Build Signer URI Fulcio writes into the certificate of a run of WORKFLOW at ref."""
    return f"https://github.com/{repo}/{WORKFLOW}@{ref}"


def policy(repo: str, ref: str):
    from kernels.verify import GitHubWorkflowPolicy

    return GitHubWorkflowPolicy(repo_id=repo, signer_uris=[signer_uri(repo, ref)])


def variant_dirs(build_dir: Path) -> list[Path]:
    return sorted(p.parent for p in Path(build_dir).glob("*/metadata.json"))


def verify_dirs(dirs: list[Path], repo: str, ref: str) -> list[tuple[str, str]]:
    """(variant, "ok" or why not) for each directory."""
    from kernels.verify import VerificationResult, verify_variant

    pol = policy(repo, ref)
    out = []
    for d in dirs:
        r = verify_variant(d, policies=[pol])
        if isinstance(r, VerificationResult.Success):
            why = "ok"
        elif isinstance(r, VerificationResult.SignatureBundleMissing):
            why = "no metadata.json.sigstore"
        elif isinstance(r, VerificationResult.DigestVerificationFailure):
            why = "files differ from the signed digest: " + "; ".join(map(str, r.violations))
        elif isinstance(r, (VerificationResult.DigestMissing, VerificationResult.MetadataMissing)):
            why = "metadata.json has no digest"
        else:
            why = f"{type(r).__name__}: {getattr(r, 'reason', '')}".rstrip(": ")
        out.append((d.name, why))
    return out


def cmd_verify(args) -> int:
    if args.hub:
        from kernels.install import install_kernel_all_variants

        build_dir = install_kernel_all_variants(args.hub, version=args.version)
    else:
        build_dir = args.build_dir
    dirs = variant_dirs(build_dir)
    failed = not dirs
    if not dirs:
        print(f"no <variant>/metadata.json under {build_dir}", file=sys.stderr)
    if args.expect is not None:
        missing = sorted(set(json.loads(args.expect)) - {d.name for d in dirs})
        if missing:
            print(f"missing variants: {missing}", file=sys.stderr)
            failed = True
    print(f"identity: {signer_uri(args.repo, args.ref)} (issuer {OIDC_ISSUER})")
    for name, why in verify_dirs(dirs, args.repo, args.ref):
        print(f"{'ok  ' if why == 'ok' else 'FAIL'} {name}" + ("" if why == "ok" else f": {why}"))
        failed |= why != "ok"
    return 1 if failed else 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m ltx_dev.release", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("matrix", help="the release build matrix as $GITHUB_OUTPUT lines")
    m.add_argument("--root", type=Path, default=ROOT, help="the checkout (default this one)")
    m.add_argument("--tag", help="the release tag; its major must be build.toml's version")
    m.add_argument("--nix", action="append", default=[], metavar="SYSTEM=FILE",
                   help="JSON list of the flake's redistributable variants for SYSTEM, checked against the pin")
    m.add_argument("--gpu-runner", default="", metavar="LABEL",
                   help=f"runs-on of the x86_64 entries: a label or a JSON list (default {json.dumps(GPU_RUNNER)}); "
                        f"'none': build them on {X86_RUNNER} without ci-test")
    m.set_defaults(run=cmd_matrix)
    v = sub.add_parser("verify", help="check the signatures and digests of build/<variant>/")
    src = v.add_mutually_exclusive_group(required=True)
    src.add_argument("build_dir", nargs="?", type=Path, help="a directory of <variant>/ directories")
    src.add_argument("--hub", metavar="REPO_ID", help="download every variant of this Hub kernel instead")
    v.add_argument("--version", type=int, default=1, help="with --hub: the kernel version (branch v<N>)")
    v.add_argument("--repo", required=True, metavar="OWNER/NAME", help="the GitHub repository that ran the release")
    v.add_argument("--ref", required=True, help="the git ref of that run, e.g. refs/tags/v1.0.0")
    v.add_argument("--expect", metavar="JSON", help="JSON list of variants that must all be there")
    v.set_defaults(run=cmd_verify)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
