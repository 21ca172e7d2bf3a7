"""A windowed streaming side input over many windows, for the expiry test (issue 43, 4).

A TestStream brings, per 10 s window ``i``, a side element ``s<i>`` at ``10 i + 1`` and a main
element ``m<i>`` at ``10 i + 5``, then moves the watermark to the window's end. The side input
is read twice by one ``Map``: as it is (fixed windows, the default trigger: every chunk kept,
``side-rows/<buffer>``) and with a trigger of its own (each window's latest firing,
``side-view/<buffer>``). Each main element writes ``m<i> <rows> <view>`` through the
exactly-once sink: its own window's side element in both, and only that. With ``fail_at``,
reading ``m<fail_at>`` raises until the file ``marker`` exists (it is made then): a run that
fails there, and the same run again, which resumes.
"""

from __future__ import annotations

import os

import apache_beam as beam
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import trigger, window
from apache_beam.transforms.window import TimestampedValue

WINDOW_S = 10


def events(windows: int) -> TestStream:
    stream = TestStream()
    for i in range(windows):
        at = WINDOW_S * i
        stream = stream.add_elements(
            [TimestampedValue(f"s{i}", at + 1), TimestampedValue(f"m{i}", at + 5)]
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


def add_pipeline(p, windows: int, output: str, fail_at: int | None = None, marker: str = ""):
    from sparkbeam.io import WriteToFilesOnCheckpoint

    stream = p | events(windows)
    fixed = window.FixedWindows(WINDOW_S)
    side = stream | "Side" >> beam.Filter(lambda e: e.startswith("s"))
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


def expected_lines(windows: int) -> list[str]:
    return sorted(f"m{i} s{i} s{i}" for i in range(windows))
