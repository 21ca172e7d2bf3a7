"""An error sparkbeam raises reaches the operator as its message, not as a traceback.

`install` sets a ``sys.excepthook`` that prints an uncaught ``sparkbeam.*`` exception as
``Name: message`` on stderr and says where its traceback is (``--log_level=DEBUG`` prints it);
others go to the previous hook. Leaves to others: the messages (each package's ``errors``).
"""

from __future__ import annotations

import functools
import logging
import sys
import traceback

_LOG = logging.getLogger("sparkbeam.errors")


@functools.cache
def install() -> None:
    """Once per process: route sparkbeam's uncaught exceptions through `report`."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not is_ours(value):
            return previous(kind, value, tb)
        print(report(value), file=sys.stderr, flush=True)

    sys.excepthook = hook


def is_ours(error: BaseException | None) -> bool:
    return error is not None and type(error).__module__.startswith("sparkbeam.")


def report(error: BaseException) -> str:
    """What the operator reads: the message alone, and where its traceback is (DEBUG)."""
    text = f"{type(error).__name__}: {error}"
    if _LOG.isEnabledFor(logging.DEBUG):
        trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        return f"{trace.rstrip()}\n{text}"
    if "--log_level=DEBUG" in text:  # a failed stage's block says so already
        return text
    return f"{text}\n(its traceback is printed with --log_level=DEBUG)"
