"""Test a splittable DoFn's self-checkpointing locally: ``check_sdf``, its CLI and pytest fixture.

``check`` owns the scenarios and the report, ``static`` the checks without Spark, ``run`` the
probe pipeline, ``cli`` the ``sparkbeam sdf-check`` command and ``pytest_plugin`` the
``sdf_checker`` fixture. The public names load lazily: the plugin costs every pytest run no Beam
import.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SdfCheckError", "SdfCheckReport", "check_sdf"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from sparkbeam.sdf.testing import check

        return getattr(check, name)
    raise AttributeError(name)
