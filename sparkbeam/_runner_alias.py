"""Teach Beam the runner name ``SparkCheckpointRunner`` without importing Beam.

Loaded at interpreter start by ``sparkbeam_runner_alias.pth``. It must stay
cheap: it only installs an import hook that, once
``apache_beam.runners.runner`` has been imported by the user's program, adds
our entry to Beam's runner-name map (which Beam matches case-insensitively).
"""

import importlib.abc
import sys

_TARGET = "apache_beam.runners.runner"
_ALIASES = {"sparkcheckpointrunner": "sparkbeam.runner.SparkCheckpointRunner"}


def _register(module) -> None:
    runner_map = getattr(module, "_RUNNER_MAP", None)
    if isinstance(runner_map, dict):
        for name, path in _ALIASES.items():
            runner_map.setdefault(name, path)


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            from importlib.util import find_spec

            spec = find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        original_exec = spec.loader.exec_module

        def exec_module(module, _exec=original_exec):
            _exec(module)
            _register(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    if _TARGET in sys.modules:
        _register(sys.modules[_TARGET])
    elif not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())


install()
