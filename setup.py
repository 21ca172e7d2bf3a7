"""Installs sparkbeam's runner alias hook next to the packages.

Everything else is in pyproject.toml. The one thing pyproject cannot say is
"put this .pth file at the root of site-packages": that file is what lets an
unmodified Beam program say --runner=SparkCheckpointRunner without importing
sparkbeam (see sparkbeam/_runner_alias.py). Both `pip install .` (build_py)
and `pip install -e .` (editable_wheel) get it.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "sparkbeam_runner_alias.pth"
HERE = os.path.dirname(os.path.abspath(__file__))


def _pth_text() -> str:
    with open(os.path.join(HERE, PTH), encoding="utf-8") as f:
        return f.read()


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:
            self.copy_file(os.path.join(HERE, PTH), os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode=True):
        outputs = list(super().get_outputs(include_bytecode))
        if not self.editable_mode:
            outputs.append(os.path.join(self.build_lib, PTH))
        return outputs


class _StrategyWithPth:
    """Wraps setuptools' editable strategy to also write our .pth file."""

    def __init__(self, inner):
        self._inner = inner

    def __call__(self, wheel, files, mapping):
        self._inner(wheel, files, mapping)
        wheel.writestr(PTH, _pth_text())

    def __enter__(self):
        self._inner.__enter__()
        return self

    def __exit__(self, *exc):
        return self._inner.__exit__(*exc)


class EditableWheelWithPth(editable_wheel):
    def _select_strategy(self, *args, **kwargs):
        return _StrategyWithPth(super()._select_strategy(*args, **kwargs))


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
