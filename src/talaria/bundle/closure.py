"""The ``talaria`` modules the runner imports: every module reachable by import statements (at module level or in
a function) from the runner's command line and the modules of ``talaria.runner`` and ``talaria.hermes``, with
the packages that hold them. The import-rule test checks that this set stays within the runner's allowed
modules (DESIGN.md 6); the build checks it again on the archive."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT_PACKAGES = ("talaria.runner", "talaria.hermes")
ROOT_MODULES = ("talaria.runner.cli",)


def module_file(src: Path, module: str) -> Path | None:
    """The file of ``module`` under ``src`` (the directory holding ``talaria``), or None when it is not one."""
    base = src.joinpath(*module.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imported(src: Path, module: str, path: Path) -> set[str]:
    """The ``talaria`` modules ``path`` (the file of ``module``) imports, ``from a import b`` counting ``a.b``
    when that is a module."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                origin = f"{base}.{node.module}" if node.module else base
            else:
                origin = node.module or ""
            names = [origin] + [f"{origin}.{alias.name}" for alias in node.names]
        for name in names:
            if (name == "talaria" or name.startswith("talaria.")) and module_file(src, name) is not None:
                found.add(name)
    return found


def runner_closure(src: Path) -> list[str]:
    """Every module of the closure with the packages above it, sorted."""
    todo = list(ROOT_MODULES)
    for package in ROOT_PACKAGES:
        folder = src.joinpath(*package.split("."))
        todo += [package] + [f"{package}.{p.stem}" for p in sorted(folder.glob("*.py")) if p.stem != "__init__"]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        path = module_file(src, module)
        if path is None:
            raise ValueError(f"the runner imports {module}, which is not in {src}")
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:n]) for n in range(1, len(parts))]
        todo += sorted(_imported(src, module, path) - seen)
    return sorted(seen)
