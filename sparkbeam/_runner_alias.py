"""Teach Beam the runner name ``SparkCheckpointRunner`` without importing Beam.

Loaded at interpreter start by ``sparkbeam_runner_alias.pth``, so it only installs an import
hook. Once the program imports ``apache_beam.runners.runner``, sparkbeam's runner joins Beam's
runner-name map; once it imports Beam's pipeline options, sparkbeam's options are registered
(``--parallelism`` & co parse before the runner exists); once it imports
``apache_beam.io.kafka``, Beam's Java Kafka transforms refuse sparkbeam's runner (``_beam_kafka``).
"""

import importlib.abc
import sys

_ALIASES = {"sparkcheckpointrunner": "sparkbeam.runner.SparkCheckpointRunner"}


def _register_runner(module) -> None:
    runner_map = getattr(module, "_RUNNER_MAP", None)
    if isinstance(runner_map, dict):
        for name, path in _ALIASES.items():
            runner_map.setdefault(name, path)


def _register_options(module) -> None:
    try:
        import sparkbeam.runner.options  # noqa: F401 - registers every sparkbeam flag
    except Exception:  # noqa: BLE001 - never break the user's import of Beam
        pass


def _guard_beam_kafka(module) -> None:
    try:
        from sparkbeam._beam_kafka import guard

        guard(module)
    except Exception:  # noqa: BLE001 - never break the user's import of Beam
        pass


_AFTER = {  # what to do once the user's program has imported each of these
    "apache_beam.runners.runner": _register_runner,
    "apache_beam.options.pipeline_options": _register_options,
    "apache_beam.io.kafka": _guard_beam_kafka,
}


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        after = _AFTER.get(fullname)
        if after is None:
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

        def exec_module(module, _exec=original_exec, _after=after):
            _exec(module)
            _after(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    for name, after in _AFTER.items():
        if name in sys.modules:
            after(sys.modules[name])
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())


install()
