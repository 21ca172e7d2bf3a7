"""Crash points for recovery tests: ``SPARKBEAM_CRASH_AT=<point>:<round>`` SIGKILLs the driver.

A kill from outside lands anywhere; these land exactly where recovery is
hardest — after a round's Spark job but before its checkpoint ("mid-round"),
and after the checkpoint's manifest but before its sink files are published
("after-commit"). The store has its own point inside the commit (see
``sparkbeam.checkpoint.commit``). Unset, this costs one dict lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "SPARKBEAM_CRASH_AT"


def crash_point(point: str, round_no: int) -> None:
    if os.environ.get(ENV) == f"{point}:{round_no}":
        os.kill(os.getpid(), signal.SIGKILL)
