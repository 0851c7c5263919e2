"""The structure of the tests, read from their own imports: a test module imports what it shares with
others from tests/helpers/ only, never from another test module or a conftest; a conftest holds
configuration, fixtures and hooks, no helpers to import."""

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
HELPERS = "tests.helpers"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(TESTS.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(path: Path) -> str:
    """The package relative imports in `path` start from."""
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imported(source: str, package: str):
    """(module, line) of every module an import names, inside functions too: `from tests.x import y`
    names tests.x.y as well (y may be a module); relative imports resolved from `package`."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            yield module, node.lineno
            for alias in node.names:
                yield f"{module}.{alias.name}", node.lineno


def _forbidden(module: str) -> bool:
    """A module of tests/ outside tests/helpers/ (`tests` itself, named on the way to tests.helpers, is not)."""
    return module.startswith("tests.") and module != HELPERS and not module.startswith(HELPERS + ".")


def _violations(source: str, package: str) -> dict:
    """{line: the test module it imports} for each import of the source outside tests/helpers/."""
    bad = {}
    for module, line in _imported(source, package):
        if _forbidden(module) and len(module) < len(bad.get(line, module + ".")):
            bad[line] = module  # `from tests.x import y`: tests.x, not also tests.x.y
    return bad


def test_tests_import_only_the_helpers():
    bad = [f"{path.relative_to(TESTS.parent)}:{line} imports {module}" for path in sorted(TESTS.rglob("*.py"))
           for line, module in sorted(_violations(path.read_text(), _package(path)).items())]
    assert not bad, "move what is shared into tests/helpers/ and import it from there:\n" + "\n".join(bad)


def test_the_rule_sees_every_form_of_import():
    source = ("import tests.conftest\nfrom tests.config.test_build import compose_config\nfrom tests import dense\n"
              "def f():\n    from .test_hamiltonians import SMALL_LATTICES\n"
              "from tests.helpers.cli import REPO\nfrom tests.helpers import golden\nfrom . import helpers\nimport numpy\n")
    assert _violations(source, "tests.physics") == {1: "tests.conftest", 2: "tests.config.test_build", 3: "tests.dense",
                                                    5: "tests.physics.test_hamiltonians", 8: "tests.physics"}


def _is_fixture(decorator) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return ast.unparse(target) in ("pytest.fixture", "fixture")


def _helpers_in(source: str) -> list:
    """The functions and classes of a conftest that are neither fixtures nor pytest hooks."""
    return [node.name for node in ast.parse(source).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
            and not node.name.startswith("pytest_") and not any(_is_fixture(d) for d in node.decorator_list)]


def test_a_conftest_holds_only_fixtures_and_hooks():
    bad = {str(path.relative_to(TESTS.parent)): _helpers_in(path.read_text()) for path in TESTS.rglob("conftest.py")}
    bad = {path: names for path, names in bad.items() if names}
    assert not bad, f"helpers belong in tests/helpers/, not in a conftest: {bad}"
    assert _helpers_in("@pytest.fixture\ndef repo():\n    pass\ndef pytest_configure(config):\n    pass\n"
                       "def run_cli(args):\n    pass\n") == ["run_cli"]
