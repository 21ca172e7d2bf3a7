"""The imports between sparkbeam's folders follow the arrows of ARCHITECTURE.md.

Parsed from the source (no import runs), so a new arrow fails here with the module that
draws it, and either the design or the import changes on purpose.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("translation", "checkpoint", "sdf", "runner", "io")
PATHS = {"io": Path("sparkbeam", "io")}  # the others are top-level folders
SUBPACKAGES = {
    "sdf": ("startpoints", "testing"),
    "runner": ("spark", "plane", "task", "rounds", "batch", "streaming"),
}

# unit -> the units it may import (besides itself)
ALLOWED = {
    "translation": set(),
    "checkpoint": set(),
    "sdf": {"checkpoint"},
    "sdf.startpoints": {"sdf", "checkpoint"},
    "sdf.testing": {"sdf", "checkpoint"},
    "runner.spark": {"runner", "checkpoint"},
    "runner.plane": {"runner.spark", "checkpoint"},
    "runner.task": {"runner.spark", "sdf", "sdf.startpoints", "checkpoint", "translation"},
    "runner.rounds": {
        "runner", "runner.plane", "runner.task", "runner.spark", "sdf", "sdf.startpoints",
        "checkpoint", "translation",
    },
    "runner.batch": {
        "runner", "runner.rounds", "runner.task", "runner.spark", "sdf", "sdf.startpoints",
        "checkpoint", "translation",
    },
    "runner.streaming": {
        "runner", "runner.rounds", "runner.task", "runner.spark", "sdf", "sdf.startpoints",
        "checkpoint", "translation",
    },
    # Sources and sinks users import: the sink protocol's task half, the startpoint kinds.
    "io": {"runner.rounds", "checkpoint"},
}  # fmt: skip
# The front door wires everything; the warm worker daemon pre-imports the task code.
FRONT_DOOR = {"runner": None, "runner.spark.daemon": None}
# Leaf modules: they import nothing of sparkbeam, so any unit may use them.
LEAVES = {"sparkbeam.runner.processes"}


def unit_of(module: str) -> str | None:
    """``sparkbeam.runner.task.records`` -> ``runner.task``; None outside the four folders."""
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "sparkbeam" or parts[1] not in FOLDERS:
        return None
    if len(parts) >= 3 and parts[2] in SUBPACKAGES.get(parts[1], ()):
        return f"{parts[1]}.{parts[2]}"
    return parts[1]


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def modules():
    for folder in FOLDERS:
        base = ROOT / PATHS.get(folder, Path(folder))
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            yield "sparkbeam." + ".".join((folder, *rel.parts)).removesuffix(".__init__"), path


def test_imports_follow_the_allowed_arrows():
    wrong = []
    for module, path in modules():
        unit = unit_of(module)
        if unit in FRONT_DOOR or module.removeprefix("sparkbeam.") in FRONT_DOOR:
            continue
        for name in imports_of(path):
            target = unit_of(name)
            if name in LEAVES or name.rsplit(".", 1)[0] in LEAVES:
                continue
            if target is None or target == unit or name in {f"sparkbeam.{f}" for f in FOLDERS}:
                continue
            if target not in ALLOWED[unit]:
                wrong.append(f"{module} ({unit}) imports {name} ({target})")
    assert not wrong, "imports against ARCHITECTURE.md's arrows:\n" + "\n".join(sorted(wrong))


def test_leaves_import_nothing_of_sparkbeam():
    for module, path in modules():
        if module in LEAVES:
            inner = {n for n in imports_of(path) if n.startswith("sparkbeam")}
            assert not inner, f"{module} is a leaf (importable from any unit): {inner}"


def test_every_subpackage_has_its_arrows():
    """A new sub-package (a folder with ``__init__.py``) gets its own row in ALLOWED."""
    for folder in FOLDERS:
        base = ROOT / PATHS.get(folder, Path(folder))
        for init in sorted(base.glob("*/__init__.py")):
            sub = init.parent.name
            assert sub in SUBPACKAGES.get(folder, ()), f"add {folder}.{sub} to SUBPACKAGES"
            assert f"{folder}.{sub}" in ALLOWED, f"add {folder}.{sub}'s arrows to ALLOWED"


def test_every_subpackage_is_installed():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for folder, subs in SUBPACKAGES.items():
        for sub in subs:
            package = f"sparkbeam.{folder}.{sub}"
            assert f'"{package}"' in text, f"add {package} to packages in pyproject.toml"


# Pickle carries records between Spark stages (the data plane) and a user's DoFn to the SDF
# checker's child run; state and handles never: they have explicit formats.
PICKLE_ALLOWED = ("sparkbeam.runner.plane.", "sparkbeam.sdf.testing.")


def test_no_pickle_of_state_or_handles():
    wrong = [
        module
        for module, path in modules()
        if not module.startswith(PICKLE_ALLOWED)
        and {"pickle", "cloudpickle"} & {n.split(".")[0] for n in imports_of(path)}
    ]
    assert not wrong, f"modules that pickle outside the data plane: {wrong}"


def _defines(path: Path, name: str) -> bool:
    """Whether the module at ``path`` defines ``name`` (a function, class, or Class.method)."""
    scope: list = ast.parse(path.read_text(encoding="utf-8")).body
    for part in name.split("."):
        found = [
            n for n in scope
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and n.name == part
        ]  # fmt: skip
        if not found:
            return False
        scope = found[0].body
    return True


def test_architecture_names_only_what_exists():
    """Every repository file ARCHITECTURE.md names exists, and every `file` `function` pair
    of its walks is defined there: the document follows the code."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    roots = ("runner/", "checkpoint/", "sdf/", "translation/", "sparkbeam/", "tests/")
    wrong = [
        f"{path}: no such file"
        for path in sorted(set(re.findall(r"`([\w/]+\.py)`", text)))
        if path.startswith(roots) and not (ROOT / path).exists()
    ]
    for path, name in re.findall(r"`([\w/]+\.py)` `([\w.]+)`", text):
        if (ROOT / path).exists() and not _defines(ROOT / path, name):
            wrong.append(f"{path} does not define {name}")
    assert not wrong, "ARCHITECTURE.md names what the code lacks:\n" + "\n".join(wrong)
