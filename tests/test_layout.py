"""The structure of the code, read from its own imports: no circle, no upward import, and each
concern in its package (core/ knows no config, files or processes; parallel/ alone knows meshes
and processes; config/ reads no other run's files)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Layers from the bottom up: a module imports from its own package or from a lower layer only.
LAYERS = [
    ("runner.errors",),
    ("runner.physics",),
    ("models", "runner.parallel"),
    ("runner.core",),
    ("runner.diagnostics",),
    ("runner.config",),
    ("runner.outputs",),
    ("runner.lifecycle",),
    ("runner.app", "runner.api", "runner.evaluate", "runner.report", "runner.doctor", "runner.cli",
     "runner.__main__", "runner"),
]
# JAX's meshes, shardings and processes: only parallel/ uses them.
PARALLEL_ONLY = {"get_abstract_mesh", "with_sharding_constraint", "set_mesh", "process_index", "process_count",
                 "multihost_utils", "NamedSharding", "PartitionSpec", "Mesh", "shard_map", "distributed", "sharding"}
# What the jitted core may not import: configs, files, processes.
CORE_FORBIDDEN = ("runner.config", "runner.lifecycle", "runner.outputs", "runner.diagnostics", "runner.parallel.distributed",
                  "runner.parallel.runtime", "omegaconf", "hydra", "pathlib", "json", "os", "subprocess")
# Files above this many lines, and functions above this many lines or positional parameters,
# may not grow: today's exceptions with their sizes (the list may only shrink).
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_POSITIONAL = 400, 60, 6


def _modules():
    files = sorted([*(ROOT / "runner").rglob("*.py"), *(ROOT / "models").rglob("*.py")])
    out = {}
    for path in files:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _package_of(name: str) -> str:
    """The concern a module belongs to (its entry in LAYERS; the entry points are one)."""
    for layer in LAYERS:
        if layer is LAYERS[-1] and name in layer:
            return "entry points"
        for pkg in layer:
            if name == pkg or (name.startswith(pkg + ".") and pkg != "runner"):
                return pkg
    raise AssertionError(f"{name} is in no layer of {__file__}: add its package to LAYERS")


def _rank(name: str) -> int:
    pkg = _package_of(name)
    return len(LAYERS) - 1 if pkg == "entry points" else next(i for i, layer in enumerate(LAYERS) if pkg in layer)


def _resolve(target: str) -> str | None:
    """The project module an import names (a module, or a name inside one), or None (third party)."""
    while target:
        if target in MODULES:
            return target
        target = target.rpartition(".")[0]
    return None


def _imports(name: str):
    """(imported project module, line) of every import in the module, inside functions too."""
    tree = ast.parse(MODULES[name].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            targets = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            found = _resolve(target)
            if found and found != name:
                yield found, node.lineno


def _third_party(name: str):
    tree = ast.parse(MODULES[name].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, node.lineno


GRAPH = {name: sorted({m for m, _ in _imports(name)}) for name in MODULES}


def test_no_import_circle():
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in GRAPH[node]:
            if state.get(nxt) == "open":
                circle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import circle: " + " -> ".join(circle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for name in GRAPH:
        if name not in state:
            visit(name)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_go_down(name):
    if name == "runner":  # the package's lazy `load`/`run` reach the API on first use
        return
    for target, line in _imports(name):
        if _package_of(target) == _package_of(name):
            continue
        assert _rank(target) < _rank(name), f"{MODULES[name].relative_to(ROOT)}:{line} imports {target}, a higher layer"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("runner.core")))
def test_core_knows_no_config_files_or_processes(name):
    for module, line in _third_party(name):
        bad = [f for f in CORE_FORBIDDEN if module == f or module.startswith(f + ".")]
        assert not bad, f"{MODULES[name].relative_to(ROOT)}:{line} imports {module}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if not n.startswith("runner.parallel")))
def test_only_parallel_knows_meshes_and_processes(name):
    tree = ast.parse(MODULES[name].read_text())
    used = {ast.unparse(n) for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and n.attr in PARALLEL_ONLY and ast.unparse(n).startswith("jax.")}
    used |= {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
             for a in n.names if (n.module or "").startswith("jax") and
             ({a.name, n.module.rpartition(".")[2]} & PARALLEL_ONLY)}
    assert not used, f"{MODULES[name].relative_to(ROOT)} uses {sorted(used)}"


def _sizes():
    modules, functions = {}, {}
    for name, path in MODULES.items():
        source = path.read_text()
        modules[name] = len(source.splitlines())
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = [*node.args.posonlyargs, *node.args.args]
                positional = len(args) - (1 if args and args[0].arg in ("self", "cls") else 0)
                functions[f"{name}.{node.name}"] = (node.end_lineno - node.lineno + 1, positional)
    return modules, functions


# Exceptions, none today: {module: lines}, {function: (lines, positional parameters)}.
LARGE_MODULES = {}
LARGE_FUNCTIONS = {}


def test_modules_and_functions_stay_small():
    modules, functions = _sizes()
    for name, lines in modules.items():
        limit = max(MAX_MODULE_LINES, LARGE_MODULES.get(name, 0))
        assert lines <= limit, f"{name} has {lines} lines (limit {limit})"
    for name, (lines, positional) in functions.items():
        allowed = LARGE_FUNCTIONS.get(name, (0, 0))
        assert lines <= max(MAX_FUNCTION_LINES, allowed[0]), f"{name} has {lines} lines"
        assert positional <= max(MAX_POSITIONAL, allowed[1]), f"{name} takes {positional} positional parameters"
