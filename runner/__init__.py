"""SparkCheckpointRunner and its options; the Spark side of sparkbeam.

Attributes load lazily so that importing ``sparkbeam.runner.options`` (done
by the runner-alias hook whenever Beam's options load) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkbeam.runner.options import SparkRunnerOptions
    from sparkbeam.runner.runner import SparkCheckpointRunner

__all__ = ["SparkCheckpointRunner", "SparkRunnerOptions"]
_MODULES = {"SparkCheckpointRunner": "runner", "SparkRunnerOptions": "options"}


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(name)
    return getattr(importlib.import_module(f"sparkbeam.runner.{_MODULES[name]}"), name)
