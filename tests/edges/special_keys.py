"""Keys Beam encodes by type (not as plain pickles), and the pipelines that move them.

Between a Reshuffle's input and output (or a GroupByKey's) Beam may pick two coders for
one key type: ``FastPrimitivesCoder`` where the type is unknown, the deterministic coder
where a key must be. The pipelines here cross such edges; the module is importable so
Spark's Python workers can unpickle the key types.
"""

from __future__ import annotations

import dataclasses
import enum
import typing

import apache_beam as beam
from apache_beam.transforms import userstate


class Point(typing.NamedTuple):
    x: int
    name: str


@dataclasses.dataclass(frozen=True)
class Tag:
    code: int
    label: str


class Color(enum.Enum):
    RED = 1
    BLUE = 2


def make_key(kind: str, i: int):
    """The key of element ``i`` for one of the key kinds the tests run."""
    return {
        "namedtuple": lambda: Point(i % 3, "p"),
        "dataclass": lambda: Tag(i % 3, "t"),
        "enum": lambda: Color.RED if i % 2 else Color.BLUE,
        "nested": lambda: (Point(i % 2, "n"), Tag(i % 2, "m")),
        "str": lambda: f"k{i % 3}",
    }[kind]()


KINDS = ("namedtuple", "dataclass", "enum", "nested", "str")


def canonical(key) -> str:
    """A comparable text for a key, equal for equal keys of any kind."""
    return repr(key)


def keyed(p, kind: str, n: int = 12):
    return (
        p
        | "Create" >> beam.Create(range(n))
        | "Key" >> beam.Map(lambda i, kind=kind: (make_key(kind, i), i))
    )


def reshuffle_then_group(p, kind: str):
    """Create -> (special key, i) -> Reshuffle -> GroupByKey -> 'key values' lines."""
    return (
        keyed(p, kind)
        | "Reshuffle" >> beam.Reshuffle()
        | "Group" >> beam.GroupByKey()
        | "Format" >> beam.MapTuple(lambda k, vs: f"{canonical(k)} {sorted(vs)}")
    )


def reshuffle_then_reshuffle(p, kind: str):
    """Two Reshuffles in a row, then the elements themselves."""
    return (
        keyed(p, kind)
        | "Reshuffle" >> beam.Reshuffle()
        | "Again" >> beam.Reshuffle()
        | "Format" >> beam.MapTuple(lambda k, v: f"{canonical(k)} {v}")
    )


class CountPerKey(beam.DoFn):
    """A stateful DoFn: the running count of each key's elements, emitted at each element."""

    SEEN = userstate.CombiningValueStateSpec("seen", sum)

    def process(self, kv, seen=beam.DoFn.StateParam(SEEN)):
        seen.add(1)
        yield f"{canonical(kv[0])} {seen.read()}"


def reshuffle_then_stateful(p, kind: str):
    """Reshuffle into a stateful DoFn keyed by the special key: per-key running counts."""
    return keyed(p, kind) | "Reshuffle" >> beam.Reshuffle() | "Count" >> beam.ParDo(CountPerKey())


PIPELINES = {
    "reshuffle-gbk": reshuffle_then_group,
    "reshuffle-reshuffle": reshuffle_then_reshuffle,
    "reshuffle-stateful": reshuffle_then_stateful,
}
