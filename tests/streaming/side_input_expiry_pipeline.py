"""A windowed streaming side input over many windows, for the expiry test (issue 43, 4).

A TestStream brings, per 10 s window ``i``, a side element ``s<i>`` at ``10 i + 1`` and a main
element ``m<i>`` at ``10 i + 5``, then moves the watermark to the window's end. The side input
is read twice by one ``Map``: as it is (fixed windows, the default trigger: every chunk kept,
``side-rows/<buffer>``) and with a trigger of its own (each window's latest firing,
``side-view/<buffer>``). Each main element writes ``m<i> <rows> <view>`` through the
exactly-once sink: its own window's side element in both, and only that. With ``fail_at``,
reading ``m<fail_at>`` raises until the file ``marker`` exists (it is made then): a run that
fails there, and the same run again, which resumes. With ``side_windows``, the side elements
of the first ``side_windows`` windows come from a ``Create`` instead, all in the first round,
and none after while the main input goes on: a side input whose source is done (a
``PeriodicImpulse`` that ended), so no stage writes it any more.
"""

from __future__ import annotations

import os

import apache_beam as beam
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import trigger, window
from apache_beam.transforms.window import TimestampedValue

WINDOW_S = 10


def events(windows: int, side_windows: int | None) -> TestStream:
    stream = TestStream()
    for i in range(windows):
        at = WINDOW_S * i
        side = [TimestampedValue(f"s{i}", at + 1)] if side_windows is None else []
        stream = stream.add_elements(
            [*side, TimestampedValue(f"m{i}", at + 5)]
        ).advance_watermark_to(at + WINDOW_S)
    return stream.advance_watermark_to_infinity()


class Read(beam.DoFn):
    def __init__(self, fail_at: int | None, marker: str) -> None:
        self.fail_at, self.marker = fail_at, marker

    def process(self, element, rows, view):
        if element == f"m{self.fail_at}" and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            raise RuntimeError(f"injected failure at {element}")
        yield f"{element} {','.join(sorted(rows))} {','.join(sorted(view))}"


def add_pipeline(
    p, windows: int, output: str, fail_at: int | None = None, marker: str = "",
    side_windows: int | None = None,
):  # fmt: skip
    from sparkbeam.io import WriteToFilesOnCheckpoint

    stream = p | events(windows, side_windows)
    fixed = window.FixedWindows(WINDOW_S)
    if side_windows is None:
        side = stream | "Side" >> beam.Filter(lambda e: e.startswith("s"))
    else:
        side = (
            p
            | "SideData" >> beam.Create(range(side_windows))
            | "Stamp" >> beam.Map(lambda i: TimestampedValue(f"s{i}", WINDOW_S * i + 1))
        )
    rows = side | "Rows" >> beam.WindowInto(fixed)
    view = side | "View" >> beam.WindowInto(
        fixed,
        trigger=trigger.Repeatedly(trigger.AfterCount(1)),
        accumulation_mode=trigger.AccumulationMode.DISCARDING,
    )
    main = (
        stream
        | "Main" >> beam.Filter(lambda e: e.startswith("m"))
        | "MainWindows" >> beam.WindowInto(fixed)
    )
    lines = main | "Read" >> beam.ParDo(
        Read(fail_at, marker), beam.pvalue.AsList(rows), beam.pvalue.AsList(view)
    )
    _ = lines | WriteToFilesOnCheckpoint(output + "/out")


def expected_lines(windows: int, side_windows: int | None = None) -> list[str]:
    side = windows if side_windows is None else side_windows
    return sorted(f"m{i} s{i} s{i}" if i < side else f"m{i}  " for i in range(windows))
