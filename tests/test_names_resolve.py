"""Every global name a function reads is bound in its module (or a builtin), and every attribute
read from a module of this package in tests/ or bench/ exists.

Tests marked ``cuda`` and the GPU-only paths of the package and ``bench/`` never run on a
CPU machine; a name left behind by a refactor there (``grads.rmsnorm_matmul_da`` after
``grads.py`` moved) would fail only on a GPU. This reads each file's code objects instead."""

from __future__ import annotations

import ast
import builtins
import dis
import functools
import importlib
import importlib.util
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FILES = sorted([*REPO.glob("tests/*.py"), *REPO.glob("bench/**/*.py"), *REPO.glob("helion_kernels/**/*.py")])


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _from_package(node: ast.AST) -> bool:
    """``from helion_kernels[.x] import ...`` (absolute)."""
    return (isinstance(node, ast.ImportFrom) and node.level == 0
            and (node.module or "").split(".")[0] == "helion_kernels")


def _module_bindings(tree: ast.Module) -> set[str]:
    """Names bound anywhere at module level (imports, defs, assignments, loop and with targets,
    also inside top-level if/try blocks) plus names declared ``global`` in a function."""
    names = set(dir(builtins)) | {"__file__", "__name__", "__doc__", "__spec__", "__package__", "__builtins__",
                                  "__path__", "__cached__", "__loader__"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            names.update(node.names)
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [item.optional_vars for item in node.items if item.optional_vars] if isinstance(node, ast.With)
                       else [node.target])
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            if isinstance(node, (ast.For, ast.With)):
                stack.extend(node.body + getattr(node, "orelse", []))
        elif isinstance(node, ast.While):
            stack.extend(node.body + node.orelse)
        elif isinstance(node, (ast.If, ast.Try)):
            stack.extend(node.body + node.orelse + getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                stack.extend(handler.body)
                if handler.name:
                    names.add(handler.name)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.NamedExpr):
            names.add(node.value.target.id)
    return names


def _global_loads(code) -> set[str]:
    """LOAD_GLOBAL names of every function nested in ``code`` (module-level code runs at import)."""
    found = set()
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            found.update(i.argval for i in dis.get_instructions(const) if i.opname == "LOAD_GLOBAL")
            found |= _global_loads(const)
    return found


@pytest.mark.ref_mode
@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_global_a_function_reads_is_bound(path):
    source, tree = path.read_text(), _tree(path)
    assert not any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names) for n in tree.body)
    missing = _global_loads(compile(source, str(path), "exec", dont_inherit=True)) - _module_bindings(tree)
    assert not missing, f"{path.relative_to(REPO)}: functions read unbound names {sorted(missing)}"


def _package_modules(tree: ast.Module) -> dict[str, object]:
    """Names bound to a module of this package anywhere in a file, inside functions too
    (``import helion_kernels as hk``, ``from helion_kernels.techniques import prenorm``), as
    module objects."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "helion_kernels":  # ``import a.b`` binds ``a``; ``as x`` binds a.b
                    module = importlib.import_module(a.name if a.asname else "helion_kernels")
                    found[a.asname or "helion_kernels"] = module
        elif _from_package(node):
            parent = importlib.import_module(node.module)
            for a in node.names:
                value = getattr(parent, a.name, None)
                if isinstance(value, types.ModuleType):
                    found[a.asname or a.name] = value
    return found


@pytest.mark.ref_mode
@pytest.mark.parametrize("path", [p for p in FILES if p.relative_to(REPO).parts[0] != "helion_kernels"],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_every_package_attribute_a_test_or_script_reads_exists(path):
    """``prenorm.rmsnorm_matmul_da``, ``runtime.launch``: read from a module of this package in
    ``tests/`` or ``bench/``, the attribute exists (assigned ones are left out: tests patch)."""
    tree = _tree(path)
    modules = _package_modules(tree)
    missing = sorted({f"{n.value.id}.{n.attr}" for n in ast.walk(tree)
                      if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and isinstance(n.value, ast.Name)
                      and n.value.id in modules and not hasattr(modules[n.value.id], n.attr)})
    assert not missing, f"{path.relative_to(REPO)}: reads attributes the package lacks: {missing}"


@pytest.mark.ref_mode
@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_name_imported_from_the_package_exists(path):
    """``from helion_kernels.x import name`` anywhere in a file, inside functions too (GPU-only
    paths import there): ``name`` is an attribute or a submodule of ``helion_kernels.x``."""
    missing = []
    for node in ast.walk(_tree(path)):
        if _from_package(node):
            parent = importlib.import_module(node.module)
            for a in node.names:
                submodule = hasattr(parent, "__path__") and importlib.util.find_spec(f"{node.module}.{a.name}")
                if not hasattr(parent, a.name) and not submodule:
                    missing.append(f"{node.module}.{a.name}")
    assert not missing, f"{path.relative_to(REPO)}: imports names the package lacks: {missing}"
