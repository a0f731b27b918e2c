"""Package boundaries, read from the source with ``ast`` (function-level imports included):
the plugin imports no tooling, no module imports itself back through others, nothing edits
``sys.path``, scripts stay thin and the plugin stays small."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("feather_sglang", "feather_cpu", "feather_kernels", "feather_rl", "feather_bench")
TOOLING = ("feather_bench", "feather_rl", "scripts")
PLUGIN_MAX_LINES = 3100
SCRIPT_MAX_LINES = 150
SKIP_DIRS = {".venv", ".venv-zoo", "models", "results", ".git", "build", "dist"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def _type_checking_only(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool):
    """Every module name an import statement names, anywhere in the file (functions included),
    except under ``if TYPE_CHECKING:``; ``from X import y`` names ``X.y`` (module ``X.y`` if there
    is one, else ``X``)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking_only(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            yield from (f"{base}.{alias.name}" for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = set()
        for imported in _imports(tree, name, path.name == "__init__.py"):
            # the deepest first-party module the name reaches (a name imported from a module
            # is an edge to that module)
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def _repo_files(suffix: str):
    for path in REPO.rglob(f"*{suffix}"):
        if not SKIP_DIRS & set(path.relative_to(REPO).parts):
            yield path


def _imports_of(package: str, forbidden) -> list[str]:
    """``module imports target`` for every import of ``package`` whose target ``forbidden``
    (called with the target's top-level package) refuses."""
    return sorted(
        f"{module} imports {target}"
        for module, targets in _graph().items()
        if module.split(".")[0] == package
        for target in targets
        if forbidden(target.split(".")[0])
    )


def test_the_cpu_runtime_stands_alone():
    """The CPU runtime serves any schedule policy: it imports nothing else of feather's."""
    assert _imports_of("feather_cpu", lambda top: top != "feather_cpu") == []


def test_the_plugin_imports_no_tooling():
    assert _imports_of("feather_sglang", lambda top: top in TOOLING) == []


def test_the_graph_sees_function_level_and_relative_imports():
    graph = _graph()
    # a function-level import in feather_sglang.plugin, a module-level one in the config
    assert "feather_sglang.sglang_integration" in graph["feather_sglang.plugin"]
    assert "feather_sglang.agents" in graph["feather_sglang.config"]
    assert "feather_bench.tools.server" in graph["feather_bench.live"]  # inside a function


def test_no_import_cycle_between_modules():
    try:
        graphlib.TopologicalSorter(_graph()).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None


def test_no_sys_path_edits():
    bad = []
    for path in _repo_files(".py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "path"
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
            ):
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert bad == [], "sys.path is edited (use python -m, or pass a path as an argument)"


def test_scripts_are_thin_and_import_no_other_script():
    for path in sorted((REPO / "scripts").iterdir()):
        lines = len(path.read_text().splitlines())
        assert lines <= SCRIPT_MAX_LINES, f"{path.name}: {lines} lines"
        if path.suffix == ".py":
            tree = ast.parse(path.read_text())
            names = {n for n in _imports(tree, "scripts." + path.stem, False)}
            assert not {n for n in names if n.split(".")[0] == "scripts"}, path.name


def test_the_plugin_stays_small():
    lines = sum(len(p.read_text().splitlines()) for p in (REPO / "feather_sglang").rglob("*.py"))
    assert lines <= PLUGIN_MAX_LINES, f"feather_sglang holds {lines} lines of Python"
