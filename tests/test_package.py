"""The package as tools see it: the names an IDE and a type checker find,
the version written once, the license."""

import ast
import re
import tomllib

import hvd_dcasgd
from helpers import ROOT


def _type_checking_imports():
    """{name: submodule} imported under ``if TYPE_CHECKING:`` in __init__.py."""
    tree = ast.parse((ROOT / "hvd_dcasgd" / "__init__.py").read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING")
    names = {}
    for node in block.body:
        for alias in node.names:
            if "." in node.module:  # from .pkg.module import name
                names[alias.asname or alias.name] = ("name", node.module)
            else:  # from .pkg import module [as name]
                names[alias.asname or alias.name] = ("module", f"{node.module}.{alias.name}")
    return names


def test_type_checkers_see_every_lazy_name_from_its_module():
    seen = _type_checking_imports()
    expected = {**{n: ("name", m) for n, m in hvd_dcasgd._EXPORTS.items()},
                **{n: ("module", m) for n, m in hvd_dcasgd._SUBMODULES.items()}}
    assert seen == expected
    assert (ROOT / "hvd_dcasgd" / "py.typed").exists()


def test_the_version_is_written_once():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "hvd_dcasgd.__version__"}
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["hvd_dcasgd"]
    newest = re.search(r"^## \[?(\d+\.\d+\.\d+)", (ROOT / "CHANGELOG.md").read_text(), re.M).group(1)
    assert newest == hvd_dcasgd.__version__, "the changelog's newest entry is the version"


def test_the_license_is_apache_2():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == {"text": "Apache-2.0"}
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
