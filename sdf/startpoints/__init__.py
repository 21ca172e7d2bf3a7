"""Startpoints in an SDF stage: operator-set start positions turned into restrictions.

``session`` is the driver side (fan-out at start, one assignment per round, delete on commit),
``applier`` the task side (rewrite the restrictions entering a process stage), ``restrictions``
the provider hooks and the OffsetRange built-in, ``errors`` what an operator can act on. The
records themselves are stored by ``sparkbeam.checkpoint.startpoints``.
"""
