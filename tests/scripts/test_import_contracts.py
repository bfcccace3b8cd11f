"""The layers contract names packages: a new module is covered unedited.

`scripts/import_contracts.py` lets a layer name ``PACKAGE.*``, every child
of the package no other layer names. These tests run `lint-imports` on a
tiny package made for each test, with the contract written once, and then
add a module the contract never heard of.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

CONFIG = """\
[tool.importlinter]
root_packages = ["pkg"]
contract_types = ["package_layers: scripts.import_contracts.PackageLayersContract"]

[[tool.importlinter.contracts]]
name = "Floors"
type = "package_layers"
layers = ["pkg.top", "pkg.facade : pkg.*", "pkg.ground | pkg.errors"]
"""


def make_package(tmp_path: Path, modules: dict[str, str]) -> None:
    (tmp_path / "pyproject.toml").write_text(CONFIG)
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    files = {
        "top.py": "import pkg.facade\n",
        "facade.py": "import pkg.service\n",
        "service.py": "import pkg.ground\n",
        "ground.py": "",
        "errors.py": "",
        **modules,
    }
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def lint(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_layers_are_kept(tmp_path: Path) -> None:
    make_package(tmp_path, {})
    result = lint(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Floors KEPT" in result.stdout


def test_a_new_module_lands_on_the_rest_floor_and_may_not_import_up(tmp_path: Path) -> None:
    make_package(tmp_path, {"fresh.py": "import pkg.top\n"})
    result = lint(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "pkg.fresh is not allowed to import pkg.top" in result.stdout


def test_a_new_module_on_the_rest_floor_may_not_be_imported_from_below(tmp_path: Path) -> None:
    make_package(tmp_path, {"fresh.py": "import pkg.ground\n", "ground.py": "import pkg.fresh\n"})
    result = lint(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "pkg.ground is not allowed to import pkg.fresh" in result.stdout


def test_a_new_package_on_the_rest_floor_is_covered_whole(tmp_path: Path) -> None:
    modules = {"fresh/__init__.py": "", "fresh/deep.py": "import pkg.top\n"}
    make_package(tmp_path, modules)
    result = lint(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "pkg.fresh is not allowed to import pkg.top" in result.stdout


def test_the_rest_floor_imports_itself_and_below(tmp_path: Path) -> None:
    make_package(
        tmp_path, {"fresh.py": "import pkg.service\nimport pkg.facade\nimport pkg.errors\n"}
    )
    result = lint(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
