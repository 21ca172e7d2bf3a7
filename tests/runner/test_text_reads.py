"""A plain ``ReadFromText`` is read by the runner (``translation.text_reads``), with Beam's lines.

On both data planes the lines of several files (a gzip one, an empty one, ``\\r\\n`` and lone
``\\r``, no final separator, files cut into several ranges) are the lines Beam's text source
reads; a read Beam's options make different (header lines, file names, streaming) keeps Beam's
reader; a file that is not UTF-8 fails the run naming the byte.
"""

from __future__ import annotations

import gzip

import apache_beam as beam
import pytest
from apache_beam.io import source_test_utils
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import PANE_INFO_UNKNOWN

from sparkbeam.runner import SparkCheckpointRunner
from sparkbeam.runner.rounds import text_ranges
from sparkbeam.runner.runner import portable_proto
from sparkbeam.translation import translate
from sparkbeam.translation.plan import EdgeKind
from tests.conftest import spark_test_options

pytestmark = pytest.mark.spark


@pytest.fixture
def files(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"one two\r\nthree\n\nfour\rfive\n" * 500 + b"tail\r")
    (tmp_path / "b.txt.gz").write_bytes(gzip.compress(b"zipped\nlines\n"))
    (tmp_path / "c.txt").write_bytes(b"")
    (tmp_path / "d.txt").write_bytes("caf\u00e9\n".encode() * 300)
    return str(tmp_path / "*.t*")


def _beam_lines(pattern: str) -> list[str]:
    """What Beam's own text source reads."""
    return source_test_utils.read_from_source(beam.io.ReadFromText(pattern)._source)


@pytest.mark.parametrize("plane", ["rdd", "frames"])
def test_the_runner_reads_beams_lines(spark, files, monkeypatch, plane):
    monkeypatch.setattr(text_ranges, "MIN_RANGE_BYTES", 1000)  # a.txt in several ranges
    monkeypatch.setattr(text_ranges, "OPEN_COST_BYTES", 10)  # several partitions
    expected = _beam_lines(files)
    assert len(expected) == 500 * 4 + 1 + 2 + 300
    options = PipelineOptions(spark_test_options(f"--data_plane={plane}"))
    with beam.Pipeline(runner=SparkCheckpointRunner(), options=options) as p:
        lines = p | "Read" >> beam.io.ReadFromText(files)
        assert_that(lines, equal_to(expected))
        counts = lines | beam.combiners.Count.Globally()
        assert_that(counts, equal_to([len(expected)]), label="CheckCount")
        placed = lines | beam.Map(_where) | "CountPlaces" >> beam.combiners.Count.PerElement()
        assert_that(placed, equal_to([(_where_read_puts_lines, len(expected))]), label="Where")


# Where Beam's Read puts every line: the Impulse's window and time, no pane.
_where_read_puts_lines = repr((MIN_TIMESTAMP, GlobalWindow(), PANE_INFO_UNKNOWN, str))


def _where(
    line,
    ts=beam.DoFn.TimestampParam,
    w=beam.DoFn.WindowParam,
    pane=beam.DoFn.PaneInfoParam,
):
    return repr((ts, w, pane, type(line)))  # a deterministic key


def _text_edges(build) -> list:
    p = beam.Pipeline()
    build(p)
    plan = translate(portable_proto(p, p.options))
    return [e for e in plan.edges if e.kind == EdgeKind.TEXT], plan


def test_only_reads_whose_lines_mean_the_same_are_the_runners(files):
    edges, plan = _text_edges(lambda p: p | "Read" >> beam.io.ReadFromText(files))
    assert len(edges) == 1 and plan.text_read(edges[0].id).pattern == files
    (stage,) = [s for s in plan.stages if edges[0].id in s.input_buffers]
    assert "Read/Read" in stage.transforms  # the user's name, for labels and errors
    for other in (
        lambda p: p | beam.io.ReadFromText(files, skip_header_lines=1),
        lambda p: p | beam.io.ReadFromText(files, strip_trailing_newlines=False),
        lambda p: p | beam.io.ReadFromText(files, delimiter=b";"),
        lambda p: p | beam.io.ReadFromTextWithFilename(files),
    ):
        assert _text_edges(other)[0] == []
    streaming = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    _ = streaming | beam.io.ReadFromText(files)
    plan = translate(portable_proto(streaming, streaming.options), streaming=True)
    assert not [e for e in plan.edges if e.kind == EdgeKind.TEXT]


def test_a_line_that_is_not_utf8_fails_the_run_as_in_beam(spark, tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"fine\n\xff\xfe broken\n")
    with pytest.raises(Exception, match=r"bad.txt is not UTF-8 text at byte 5"):
        with beam.Pipeline(runner=SparkCheckpointRunner(), options=PipelineOptions(
            spark_test_options()
        )) as p:  # fmt: skip
            _ = p | beam.io.ReadFromText(str(tmp_path / "bad.txt")) | beam.Map(len)
