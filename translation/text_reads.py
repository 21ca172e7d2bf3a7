"""``ReadFromText``: the runner reads the lines in bulk instead of Beam's per-line SDF reader.

Beam's reader passes each line through its Python line reader, a restriction tracker's claim
and a watermark estimator (a fifth of a word count's read stage), plus a Spark stage that only
splits the source. A ``Read`` of a plain ``_TextSource`` whose lines mean the same either way
(UTF-8, trailing separators stripped, no header lines, the default separator, a static
pattern) is marked ``TEXT_READ_URN`` and becomes one read of its ``text:<pcollection>``
buffer, with which its consumers fuse. ``runner.rounds.text_ranges`` splits the files,
``runner.task.text_lines`` reads them. Any other source keeps Beam's reader. Batch only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from apache_beam import coders
from apache_beam.io import iobase
from apache_beam.options.value_provider import StaticValueProvider
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import pipeline_context
from apache_beam.runners.portability.fn_api_runner import translations as t

from sparkbeam.translation.buffer_reads import buffer_of, buffer_stage
from sparkbeam.translation.plan import BufferId, EdgeKind

TEXT_READ_URN = "sparkbeam:transform:text_read:v1"
# The data input of a stage reading a ``text:`` buffer (``runner.task.text_lines``): its chunks
# are lines, not encoded windowed values.
TEXT_LINES_INPUT_URN = "sparkbeam:runner:text_lines_input:v1"
_READ_URN = common_urns.deprecated_primitives.READ.urn


@dataclass(frozen=True)
class TextRead:
    """One ``ReadFromText`` the runner reads: its files and where their lines go."""

    transform: str  # the user's name of the Read
    pattern: str  # a Beam FileSystems pattern (any filesystem Beam knows)
    compression: str  # a Beam ``CompressionTypes`` value ("auto", "uncompressed", ...)
    buffer: BufferId


def mark_text_reads(pipeline: beam_runner_api_pb2.Pipeline) -> tuple[TextRead, ...]:
    """Mark (in place) each ``Read`` the runner reads itself; returns them in a stable order."""
    components = pipeline.components
    context = None
    reads = []
    for tid in sorted(components.transforms):
        transform = components.transforms[tid]
        if transform.spec.urn != _READ_URN or len(transform.outputs) != 1:
            continue
        if context is None:
            context = pipeline_context.PipelineContext(components)
        read = _text_read(transform, context)
        if read is None:
            continue
        _drop_subtransforms(components, transform)
        transform.spec.urn = TEXT_READ_URN
        transform.spec.payload = b""
        reads.append(read)
    return tuple(reads)


def _text_read(transform, context) -> TextRead | None:
    from apache_beam.io.textio import _TextSource

    payload = beam_runner_api_pb2.ReadPayload.FromString(transform.spec.payload)
    if payload.is_bounded != beam_runner_api_pb2.IsBounded.BOUNDED:
        return None
    try:
        source = iobase.SourceBase.from_runner_api(payload.source, context)
    except Exception:  # noqa: BLE001 - not ours to read: Beam's reader reads it
        return None
    if type(source) is not _TextSource:  # subclasses add to the lines (file names, ...)
        return None
    settings = vars(source)
    pattern = settings.get("_pattern")
    plain = (
        isinstance(pattern, StaticValueProvider)
        and isinstance(pattern.get(), str)
        and settings.get("_strip_trailing_newlines") is True
        and type(settings.get("_coder")) is coders.StrUtf8Coder
        and settings.get("_skip_header_lines") == 0
        and settings.get("_header_matcher") is None
        and settings.get("_header_processor") is None
        and settings.get("_delimiter") is None
        and settings.get("_escapechar") is None
        and isinstance(settings.get("_compression_type"), str)
    )
    if not plain:
        return None
    (pcoll,) = transform.outputs.values()
    return TextRead(
        transform=transform.unique_name,
        pattern=cast(StaticValueProvider, pattern).get(),
        compression=settings["_compression_type"],
        buffer=buffer_of(EdgeKind.TEXT, pcoll),
    )


def _drop_subtransforms(components, transform) -> None:
    todo = list(transform.subtransforms)
    del transform.subtransforms[:]
    while todo:
        tid = todo.pop()
        if tid in components.transforms:
            todo.extend(components.transforms[tid].subtransforms)
            del components.transforms[tid]


def expand_text_reads(stages, context):
    """Each marked Read becomes a read of its ``text:`` buffer; its consumers fuse with it."""
    for stage in stages:
        if len(stage.transforms) != 1 or stage.transforms[0].spec.urn != TEXT_READ_URN:
            yield stage
            continue
        transform = stage.transforms[0]
        (tag, pcoll) = t.only_element(transform.outputs.items())
        yield buffer_stage(
            transform.unique_name,
            {tag: pcoll},
            buffer_of(EdgeKind.TEXT, pcoll).encode("utf-8"),
            stage.downstream_side_inputs,
            stage.must_follow,
        )
