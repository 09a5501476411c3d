"""The test suite's own layout holds: test modules never import test modules (what they
share lives in ``tests/support/``, fixtures in conftest.py), ``tests/support/`` imports no
test module, and bench/ takes nothing of the tests but ``tests.support``. Read from the
source (every import, also one inside a function), so a planted import shows it can fail.
Every test module declares its tier (``tests/support/tiers.py``): one without fails its
collection, and ``make quick`` leaves the ``process`` tier out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(path: Path, root: Path) -> list[str]:
    """Every module ``path`` imports (``from x import y`` also as ``x.y``), absolute."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            module = node.module or ""
            if node.level:
                module = ".".join([*base, module] if module else base)
            found += [module, *(f"{module}.{alias.name}" for alias in node.names)]
    return found


def is_test_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "tests" and len(parts) > 1 and parts[1].startswith(("test_", "conftest"))


def problems(root: Path) -> list[str]:
    """What breaks the layout under ``root`` (a checkout), one line each."""
    found = []
    for path in sorted((root / "tests").rglob("*.py")):
        for module in imported_modules(path, root):
            if is_test_module(module):
                found.append(f"{path.relative_to(root)} imports {module}")
    for path in sorted((root / "bench").glob("*.py")):
        for module in imported_modules(path, root):
            if module.split(".")[0] == "tests" and not module.startswith("tests.support"):
                found.append(f"{path.relative_to(root)} imports {module}")
    return found


def test_no_test_module_imports_another_and_bench_takes_only_support() -> None:
    assert problems(ROOT) == []


@pytest.mark.parametrize(
    ("where", "line"),
    [
        ("tests/test_x.py", "from .test_y import helper"),
        ("tests/test_x.py", "from tests import test_y as walk"),
        ("tests/test_x.py", "from .conftest import TEMPLATE"),
        ("tests/support/x.py", "from tests.test_y import helper"),
        ("bench/x.py", "from tests.test_y import helper"),
        ("bench/x.py", "from tests import test_y"),
    ],
)
def test_a_planted_import_is_found(tmp_path: Path, where: str, line: str) -> None:
    for folder in ("tests/support", "bench"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "tests" / "test_y.py").write_text("helper = 1\n")
    (tmp_path / "tests" / "support" / "fine.py").write_text("from tests.support import x\n")
    (tmp_path / "bench" / "fine.py").write_text("from tests.support.x import y\n")
    (tmp_path / where).write_text(f"def f() -> None:\n    {line}\n")
    found = problems(tmp_path)
    assert len(found) >= 1 and all(f.startswith(where) for f in found), found


def test_a_module_without_exactly_one_tier_fails_its_collection(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_none="def test_a() -> None:\n    assert True\n",
        test_two=(
            "import pytest\n\npytestmark = [pytest.mark.unit, pytest.mark.app]\n\n"
            "def test_b() -> None:\n    assert True\n"
        ),
        test_one=(
            "import pytest\n\npytestmark = [pytest.mark.anyio, pytest.mark.app]\n\n"
            "def test_c() -> None:\n    assert True\n"
        ),
    )
    result = pytester.runpytest("-p", "tests.support.tiers", "--continue-on-collection-errors")
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*test_none.py: declare exactly one tier (*), found none",
            "*test_two.py: declare exactly one tier (*), found unit and app",
        ],
        consecutive=False,
    )


def test_quick_leaves_out_the_process_tier_and_postgresql(pytester: pytest.Pytester) -> None:
    """``-m "not process"`` (make quick): a test's ``postgresql`` parameter and a test
    marked ``process`` in an ``app`` module are left out, the rest runs."""
    pytester.makepyfile(
        test_mixed="""
        import pytest

        pytestmark = pytest.mark.app

        @pytest.fixture(params=["sqlite", "postgresql"])
        def store_backend(request: pytest.FixtureRequest) -> str:
            return str(request.param)

        def test_store(store_backend: str) -> None:
            assert store_backend == "sqlite"

        @pytest.mark.process
        def test_subprocess() -> None:
            raise AssertionError("not in quick")
        """,
        test_far="""
        import pytest

        pytestmark = pytest.mark.process

        def test_far() -> None:
            raise AssertionError("not in quick")
        """,
    )
    result = pytester.runpytest("-p", "tests.support.tiers", "-m", "not process", "-v")
    result.assert_outcomes(passed=1, deselected=3)
    result.stdout.fnmatch_lines(["*test_store?sqlite? PASSED*"])
