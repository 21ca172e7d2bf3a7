"""A helper module of the user's package, imported by the DoFn's module."""

FACTOR = 7


def scale(x: int) -> int:
    return x * FACTOR
