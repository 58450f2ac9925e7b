"""The package's shape: subpackages on floors, each importing only what its
``__init__`` docstring says it may ("May import: ..."), and no import circle
between modules.  Imports under ``if TYPE_CHECKING:`` are annotations, not
dependencies, and count only where the docstring names them."""

import ast
import re
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from helpers import ROOT

PACKAGE = ROOT / "hvd_dcasgd"


def _subpackages() -> List[str]:
    return sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())


def _declared(sub: str) -> Tuple[Set[str], Set[str]]:
    """(may import, may import for annotations only), read from the subpackage's docstring."""
    doc = ast.get_docstring(ast.parse((PACKAGE / sub / "__init__.py").read_text())) or ""
    match = re.search(r"May import:(.*?)(?:\n\n|$)", doc, re.S)
    assert match, f"hvd_dcasgd/{sub}/__init__.py's docstring says what it may import ('May import: ...')"
    text = " ".join(match.group(1).split())
    if "every other subpackage but" in text:
        return set(_subpackages()) - set(re.findall(r"`(\w+)`", text)) - {sub}, set()
    allowed, annotations = set(), set()
    for item in re.split(r"[,;](?![^(]*\))", text):
        names = set(re.findall(r"`(\w+)`", item.split("(")[0]))
        (annotations if "annotations only" in item else allowed).update(names)
    return allowed, annotations


def _type_checking_lines(tree: ast.Module) -> Set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports(path: Path, package: Path = PACKAGE) -> List[Tuple[str, str, bool, bool]]:
    """(subpackage, module, under TYPE_CHECKING, at the top level of the module) for each import of the
    package's own modules in ``path``, a module of ``package``."""
    tree = ast.parse(path.read_text())
    annotation_lines = _type_checking_lines(tree)
    top_level = {id(node) for node in tree.body}
    here = path.relative_to(package).parts[:-1]  # ('algorithm',) or () for the top level
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(here[: len(here) - (node.level - 1)])
                target = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == "hvd_dcasgd":
                target = node.module.split(".")[1:]
            else:
                continue
            targets = [target + [alias.name] for alias in node.names] if len(target) < 2 else [target]
        elif isinstance(node, ast.Import):
            targets = [a.name.split(".")[1:] for a in node.names if a.name.split(".")[0] == "hvd_dcasgd"]
        else:
            continue
        for t in targets:
            if len(t) >= 2:
                found.append((t[0], t[1], node.lineno in annotation_lines, id(node) in top_level))
    return found


def _circle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """A path that comes back to where it started in ``graph`` (node -> the nodes it imports), or ``None``."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: List[str]) -> Optional[List[str]]:
        if state.get(node) == 1:
            return path + [node]
        if state.get(node) == 2:
            return None
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt, path + [node])
            if found:
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def test_a_circle_is_found():
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set(), "c": {"b"}}) is None


def test_the_top_level_holds_only_subpackages():
    flat = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert flat == [], f"modules outside a subpackage: {flat}"
    assert {"common", "runtime", "protocol", "observability", "algorithm", "serving", "api", "launcher"} \
        <= set(_subpackages())


def test_each_subpackage_imports_only_what_its_docstring_allows():
    wrong = []
    for sub in _subpackages():
        allowed, annotations = _declared(sub)
        for path in sorted((PACKAGE / sub).glob("*.py")):
            for target, module, annotation, _ in _imports(path):
                ok = target == sub or target in allowed or (annotation and target in annotations)
                if not ok:
                    wrong.append(f"{sub}/{path.name} imports {target}.{module}")
    assert wrong == []


def test_the_declared_floors_have_no_circle():
    graph = {sub: _declared(sub)[0] for sub in _subpackages()}
    assert _circle(graph) is None, f"a circle between subpackages: {' -> '.join(_circle(graph))}"


def test_no_import_circle_between_modules():
    """Top-level imports only: an import inside a function runs when it is called, after every module loaded."""
    graph: Dict[str, Set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__init__.py":
            continue
        name = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        graph[name] = {f"{t}.{m}" for t, m, annotation, top in _imports(path) if top and not annotation}
    assert _circle(graph) is None, f"an import circle: {' -> '.join(_circle(graph))}"
    assert len(graph) >= 40


def test_the_reading_of_imports_sees_every_form(tmp_path):
    """Relative, absolute, ``from . import`` and annotation-only imports are each read as what they are."""
    module = tmp_path / "protocol" / "probe.py"
    module.parent.mkdir()
    module.write_text("from typing import TYPE_CHECKING\n"
                      "from ..algorithm.server import ParameterServer\n"
                      "from . import channel\n"
                      "import hvd_dcasgd.serving.loop\n"
                      "if TYPE_CHECKING:\n    from ..api.optimizer import DistributedOptimizer\n"
                      "def f():\n    from ..common import errors\n")
    assert sorted(_imports(module, tmp_path)) == [
        ("algorithm", "server", False, True), ("api", "optimizer", True, False), ("common", "errors", False, False),
        ("protocol", "channel", False, True), ("serving", "loop", False, True)]
    assert "algorithm" not in _declared("protocol")[0], "so the first import above breaks protocol's floor"
