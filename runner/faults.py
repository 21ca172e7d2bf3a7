"""Crash points for recovery tests: ``SPARKBEAM_CRASH_AT=<point>:<round>`` SIGKILLs the driver.

They land where recovery is hardest: after a round's Spark job but before its checkpoint
("mid-round"), and after its manifest but before its sink files are published
("after-commit"); the store has its own inside the commit (``sparkbeam.checkpoint.commit``).
"""

from __future__ import annotations

import os
import signal

ENV = "SPARKBEAM_CRASH_AT"


def crash_point(point: str, round_no: int) -> None:
    if os.environ.get(ENV) == f"{point}:{round_no}":
        os.kill(os.getpid(), signal.SIGKILL)
