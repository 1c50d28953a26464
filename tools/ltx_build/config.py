"""Read build.toml (edition 5) and check the rules kernel-builder enforces."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from . import BuildError

KERNEL_NAME = "ltx-kernels"  # the build.toml that --root's default looks for
# The checkout this package lives in, when it is installed editable (or run from the tree).
PACKAGE_CHECKOUT = Path(__file__).resolve().parents[2]
NAME_RE = re.compile(r"^[a-z][-a-z0-9]*[a-z0-9]$")
CAPABILITY_RE = re.compile(r"^\d+\.\d+[af]?(\+PTX)?$")
BACKENDS = {"cann", "cpu", "cuda", "metal", "neuron", "rocm", "tpu", "xpu"}
DEPENDS = {"torch", "cutlass_2_10", "cutlass_3_5", "cutlass_3_6", "cutlass_3_8", "cutlass_3_9", "cutlass_4_0",
           "cutlass_4_4", "cutlass_4_5", "sycl_tla", "metal-cpp"}

GENERAL_KEYS = {"name", "version", "edition", "license", "backends", "upstream", "source", "python-depends",
                "kernel-depends", "hub", "cuda"}
HUB_KEYS = {"repo-id", "branch"}
TORCH_KEYS = {"src", "include", "pyext", "minver", "maxver", "cxx-flags", "stable-abi"}
KERNEL_KEYS = {"backend", "depends", "src", "include", "cxx-flags", "cuda-capabilities", "cuda-flags",
               "cuda-minver", "rocm-archs", "hip-flags", "sycl-flags"}


@dataclass(frozen=True)
class KernelConfig:
    name: str
    backend: str
    src: tuple[str, ...]
    capabilities: tuple[str, ...]
    cuda_flags: tuple[str, ...] = ()
    cxx_flags: tuple[str, ...] = ()
    include: tuple[str, ...] = ()


@dataclass(frozen=True)
class BuildConfig:
    root: Path
    name: str
    version: int
    license: str
    backends: tuple[str, ...]
    repo_id: str
    torch_src: tuple[str, ...]
    torch_include: tuple[str, ...] = ()
    torch_cxx_flags: tuple[str, ...] = ()
    pyext: tuple[str, ...] = ("py", "pyi")
    python_depends: tuple[str, ...] = ()  # [general] and [general.cuda] python-depends, as metadata.json lists them
    kernels: tuple[KernelConfig, ...] = field(default_factory=tuple)
    upstream: str | None = None
    source: str | None = None
    kernel_depends: tuple[dict, ...] = ()  # [general] and [general.cuda] kernel-depends tables

    @property
    def python_name(self) -> str:
        return self.name.replace("-", "_")

    @property
    def capabilities(self) -> list[str]:
        """Every capability any CUDA kernel asks for, in first-seen order."""
        seen: list[str] = []
        for k in self.kernels:
            for c in k.capabilities:
                if c not in seen:
                    seen.append(c)
        return seen


def _unknown(section: str, table: dict, allowed: set[str]) -> list[str]:
    return [f"[{section}] has unknown key '{k}'" for k in table if k not in allowed]


def _str_list(errors: list[str], where: str, value, required: bool = False) -> tuple[str, ...]:
    if value is None:
        if required:
            errors.append(f"{where} is required")
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        errors.append(f"{where} must be a list of strings")
        return ()
    if required and not value:
        errors.append(f"{where} must not be empty")
    return tuple(value)


def schema_errors(data: dict) -> list[str]:
    """Every violation of the edition-5 rules in a parsed build.toml."""
    errors: list[str] = []
    general = data.get("general")
    if not isinstance(general, dict):
        return ["[general] section is missing"]
    errors += _unknown("general", general, GENERAL_KEYS)
    name = general.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        errors.append(f"[general] name {name!r} must match {NAME_RE.pattern} (dashes, not underscores)")
    if general.get("edition") != 5:
        errors.append(f"[general] edition must be 5, got {general.get('edition')!r}")
    if not isinstance(general.get("version"), int) or isinstance(general.get("version"), bool):
        errors.append("[general] version must be an integer")
    if not isinstance(general.get("license"), str) or not general.get("license"):
        errors.append("[general] license is required")
    backends = _str_list(errors, "[general] backends", general.get("backends"), required=True)
    errors += [f"[general] backends has unknown backend '{b}'" for b in backends if b not in BACKENDS]
    hub = general.get("hub", {})
    if not isinstance(hub, dict):
        errors.append("[general.hub] must be a table")
    else:
        errors += _unknown("general.hub", hub, HUB_KEYS)
    frameworks = [k for k in ("torch", "torch-noarch", "tvm-ffi") if k in data]
    if len(frameworks) != 1:
        errors.append(f"exactly one of [torch], [torch-noarch], [tvm-ffi] is required, found {frameworks}")
    torch = data.get("torch", {})
    if isinstance(torch, dict):
        errors += _unknown("torch", torch, TORCH_KEYS)
        _str_list(errors, "[torch] src", torch.get("src"))
    extra = set(data) - {"general", "torch", "torch-noarch", "tvm-ffi", "kernel"}
    errors += [f"unknown top-level section [{k}]" for k in sorted(extra)]
    for kname, kernel in data.get("kernel", {}).items():
        where = f"kernel.{kname}"
        if not isinstance(kernel, dict):
            errors.append(f"[{where}] must be a table")
            continue
        errors += _unknown(where, kernel, KERNEL_KEYS)
        backend = kernel.get("backend")
        if backend not in backends:
            errors.append(f"[{where}] backend {backend!r} is not one of [general] backends {list(backends)}")
        depends = _str_list(errors, f"[{where}] depends", kernel.get("depends"))
        if "depends" not in kernel:
            errors.append(f"[{where}] depends is required")
        errors += [f"[{where}] depends has unknown dependency '{d}'" for d in depends if d not in DEPENDS]
        _str_list(errors, f"[{where}] src", kernel.get("src"), required=True)
        caps = _str_list(errors, f"[{where}] cuda-capabilities", kernel.get("cuda-capabilities"))
        errors += [f"[{where}] cuda-capabilities has malformed '{c}'" for c in caps if not CAPABILITY_RE.match(c)]
    return errors


def load(root: Path) -> BuildConfig:
    path = Path(root) / "build.toml"
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise BuildError(f"{path} not found: pass the repository root as --root") from None
    except tomllib.TOMLDecodeError as e:
        raise BuildError(f"{path} is not valid TOML: {e}") from None
    errors = schema_errors(data)
    if errors:
        raise BuildError(f"{path} breaks the edition-5 schema:\n  " + "\n  ".join(errors))
    general, torch = data["general"], data["torch"]
    cuda = general.get("cuda", {})  # kernel-builder adds these for the cuda backend (Metadata::for_backend)
    kernels = tuple(
        KernelConfig(
            name=kname,
            backend=k["backend"],
            src=tuple(k["src"]),
            capabilities=tuple(k.get("cuda-capabilities", ())),
            cuda_flags=tuple(k.get("cuda-flags", ())),
            cxx_flags=tuple(k.get("cxx-flags", ())),
            include=tuple(k.get("include", ())),
        )
        for kname, k in data.get("kernel", {}).items()
    )
    return BuildConfig(
        root=Path(root).resolve(),
        name=general["name"],
        version=general["version"],
        license=general["license"],
        backends=tuple(general["backends"]),
        repo_id=general.get("hub", {}).get("repo-id", ""),
        torch_src=tuple(torch.get("src", ())),
        torch_include=tuple(torch.get("include", ())),
        torch_cxx_flags=tuple(torch.get("cxx-flags", ())),
        pyext=tuple(torch.get("pyext", ("py", "pyi"))),
        python_depends=(*general.get("python-depends", ()), *cuda.get("python-depends", ())),
        kernels=kernels,
        upstream=general.get("upstream"),
        source=general.get("source"),
        kernel_depends=(*general.get("kernel-depends", ()), *cuda.get("kernel-depends", ())),
    )


def source_errors(cfg: BuildConfig, kernel_dir: str = "kernel_src") -> list[str]:
    """Listed sources that do not exist, and CUDA sources that no kernel lists."""
    errors = []
    listed = set(cfg.torch_src)
    for k in cfg.kernels:
        listed.update(k.src)
    errors += [f"listed source '{s}' does not exist" for s in sorted(listed) if not (cfg.root / s).is_file()]
    for cu in sorted((cfg.root / kernel_dir).rglob("*.cu")):
        rel = cu.relative_to(cfg.root).as_posix()
        if rel not in listed:
            errors.append(f"'{rel}' is not listed in any [kernel.*] src of build.toml")
    return errors


def _names_kernel(directory: Path) -> bool:
    try:
        return tomllib.loads((directory / "build.toml").read_text()).get("general", {}).get("name") == KERNEL_NAME
    except (OSError, tomllib.TOMLDecodeError):
        return False


def find_root(start: Path | None = None, installed_from: Path = PACKAGE_CHECKOUT) -> Path:
    """The repository to build when --root is not given: the nearest directory
    from `start` (the current one) upward whose build.toml names ltx-kernels,
    else the checkout this package was installed from (editable install)."""
    start = Path.cwd() if start is None else Path(start).resolve()
    for directory in (start, *start.parents, installed_from):
        if _names_kernel(directory):
            return directory
    raise BuildError(f"no {KERNEL_NAME} checkout here: no build.toml with name = \"{KERNEL_NAME}\" in {start} or a "
                     f"directory above it, and this package ({installed_from}) is not installed from a checkout. "
                     "Run inside the repository or pass --root")
