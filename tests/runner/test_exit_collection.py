"""A driver skips CPython's last full garbage collection at exit (``skip_last_collection_at_exit``).

The collection walked the whole driver heap (Beam, PySpark, the plan) for 0.3-0.5 s of every
run's wall time. The heap is frozen by an exit handler registered at the first run, so the
handlers a program registers after that run before it (the heap still collectable), and those
registered before run after it, as ever.
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import atexit, gc
atexit.register(lambda: print("earlier handler, heap frozen:", gc.get_freeze_count() > 0))
from sparkbeam.runner.runner import skip_last_collection_at_exit
skip_last_collection_at_exit()
skip_last_collection_at_exit()  # the second run of a process registers nothing more
atexit.register(lambda: print("later handler, heap frozen:", gc.get_freeze_count() > 0))
"""


def test_the_heap_is_frozen_after_the_later_exit_handlers_and_before_the_earlier():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.splitlines() == [
        "later handler, heap frozen: False",
        "earlier handler, heap frozen: True",
    ]
