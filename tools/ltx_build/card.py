"""Render CARD.md (kernel-builder's card template convention) into build/CARD.md.

The function and layer lists come from the package source, read statically
(no import, so no compiled library is needed): the names in ``__all__`` of
``torch-ext/<pkg>/__init__.py`` that are functions defined in the package,
each with the first line of its docstring, and the ``nn.Module`` classes the
``layers`` module defines or imports from the package.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from . import BuildError, config

CARD_TEMPLATE = "CARD.md"


@dataclass(frozen=True)
class PackageApi:
    functions: list[str]
    summaries: dict[str, str]
    layers: list[str]


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError):
        return None


def _all_names(module: ast.Module) -> list[str]:
    for node in module.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                return [str(v) for v in ast.literal_eval(node.value)]
            except ValueError:
                return []
    return []


def _relative_imports(module: ast.Module) -> dict[str, str]:
    """name -> submodule for every ``from .submodule import name``."""
    found = {}
    for node in module.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                found[alias.asname or alias.name] = node.module
    return found


def _module_path(package_dir: Path, name: str) -> Path:
    as_file = package_dir / f"{name}.py"
    return as_file if as_file.is_file() else package_dir / name / "__init__.py"


def _definitions(package_dir: Path, submodule: str) -> dict[str, ast.AST]:
    tree = _parse(_module_path(package_dir, submodule))
    if tree is None:
        return {}
    return {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def _summary(docstring: str) -> str:
    """The docstring's first paragraph on one line."""
    return " ".join(docstring.strip().split("\n\n")[0].split())


def _is_module_subclass(cls: ast.ClassDef, layer_names: set[str]) -> bool:
    for base in cls.bases:
        text = ast.unparse(base)
        if text in ("nn.Module", "torch.nn.Module", "Module") or text in layer_names:
            return True
    return False


def package_api(package_dir: Path) -> PackageApi:
    init = _parse(package_dir / "__init__.py")
    if init is None:
        raise BuildError(f"cannot read {package_dir / '__init__.py'}")
    imports = _relative_imports(init)
    functions, summaries = [], {}
    for name in _all_names(init):
        if imports.get(name, "_ops") == "_ops":  # the generated op plumbing, not a kernel function
            continue
        node = _definitions(package_dir, imports[name]).get(name)
        if isinstance(node, ast.FunctionDef):
            functions.append(name)
            summaries[name] = _summary(ast.get_docstring(node) or "")

    layers: list[str] = []
    layers_tree = _parse(_module_path(package_dir, "layers"))
    if layers_tree is not None and "layers" in _all_names(init):
        # Classes defined in layers (in order, subclasses of earlier layers
        # count), then nn.Module classes it imports from other package modules.
        for node in layers_tree.body:
            if isinstance(node, ast.ClassDef) and _is_module_subclass(node, set(layers)):
                layers.append(node.name)
        for name, submodule in _relative_imports(layers_tree).items():
            node = _definitions(package_dir, submodule).get(name)
            if isinstance(node, ast.ClassDef) and _is_module_subclass(node, set()) and name not in layers:
                layers.append(name)
    return PackageApi(functions, summaries, layers)


def render(root: Path, variants: list[str] | None = None) -> str:
    try:
        import jinja2
    except ImportError:
        raise BuildError("rendering CARD.md needs jinja2 (`pip install jinja2`; torch depends on it)") from None
    cfg = config.load(root)
    template_path = root / CARD_TEMPLATE
    if not template_path.is_file():
        raise BuildError(f"{template_path} (the card template) not found")
    if not cfg.repo_id:
        raise BuildError("build.toml has no [general.hub] repo-id: the card needs it")
    api = package_api(root / "torch-ext" / cfg.python_name)
    # trim_blocks as kernel-builder's minijinja environment, so the template renders the same in both.
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.ChainableUndefined, keep_trailing_newline=True)
    return env.from_string(template_path.read_text()).render(
        repo_id=cfg.repo_id,
        version=cfg.version,
        license=cfg.license.lower(),
        functions=api.functions,
        function_summaries=api.summaries,
        layers=api.layers,
        has_benchmark=any((root / "benchmarks").glob("benchmark*.py")),
        upstream=None,
        variants=variants or [],
    )


def write(root: Path, build_dir: Path | None = None) -> Path:
    """Render into ``build/CARD.md`` (where kernel-builder's upload looks for it)."""
    build_dir = build_dir or root / "build"
    variants = sorted(p.name for p in build_dir.iterdir() if (p / "metadata.json").is_file()) \
        if build_dir.is_dir() else []
    build_dir.mkdir(parents=True, exist_ok=True)
    out = build_dir / "CARD.md"
    out.write_text(render(root, variants))
    return out
