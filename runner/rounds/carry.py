"""Reports carried downstream with the data, so a stage read once needs no cache.

Each task's reports for the driver (metrics, warnings, sink files, commit messages, ...) must
reach it exactly once. Rather than keeping every stage's output to read its reports in a pass
of their own, a stage hands them with its data to one consumer, its *carrier*, through narrow
edges and shuffles alike; the carrier passes them on after its own. A stage with no carrier
hands them to the job's final collect. So a chain of stages is one Python task per partition,
and only a stage read more than once is cached. Batch and streaming plan their carriers here
(``plan_carriers``); the functions below it run in tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from sparkbeam.runner.task.records import OutputRecord, is_report
from sparkbeam.translation.plan import BufferId, StagePlan

Read = tuple[BufferId, str, str]
"""(buffer, consumer stage, the consumer's data-input transform): one read of a stage's output."""


@dataclass(frozen=True)
class Carriers:
    """Which read of each stage's output carries its reports, and how often it is read."""

    carrier: dict[str, Read]
    reads: dict[str, int]  # reads of the stage's dataset, the final collect included

    def carries(self, writer: str, buffer: BufferId, consumer: str | None, transform=None) -> bool:
        """Whether ``consumer``'s read of ``buffer`` through ``transform`` carries ``writer``'s
        reports (``consumer`` None: a side input, data only)."""
        return consumer is not None and self.carrier.get(writer) == (buffer, consumer, transform)

    def into(self, writer: str) -> BufferId | None:
        """The buffer ``writer``'s reports leave by (None: the final collect)."""
        read = self.carrier.get(writer)
        return read[0] if read else None

    def cache(self, stage: str) -> bool:
        """Whether the stage's dataset is read more than once, hence worth keeping."""
        return self.reads.get(stage, 0) > 1


def plan_carriers(
    stages: Sequence[StagePlan],
    can_carry: Callable[[StagePlan, BufferId], bool],
    side_reads: Callable[[BufferId], int],
    writers: Iterable[str] | None = None,
) -> Carriers:
    """The carrier of each of ``writers`` (default: every stage) among ``stages``.

    ``can_carry(consumer, buffer)``: the consumer's task passes carried reports on (a stage that
    collects its own reports in jobs of its own cannot). ``side_reads(buffer)``: how many
    side-input jobs read the buffer."""
    reads_of: dict[BufferId, list[Read]] = {}
    for consumer in stages:
        for transform, buffer in consumer.inputs:
            reads_of.setdefault(buffer, []).append((buffer, consumer.id, transform))
    carrier: dict[str, Read] = {}
    reads: dict[str, int] = {}
    eligible = set(writers) if writers is not None else {s.id for s in stages}
    by_id = {s.id: s for s in stages}
    for stage in stages:
        if stage.id not in eligible:
            continue
        outputs = list(dict.fromkeys(stage.output_buffers))
        targets = [r for b in outputs for r in reads_of.get(b, ())]
        able = [r for r in targets if can_carry(by_id[r[1]], r[0])]
        if able:
            carrier[stage.id] = able[0]
        reads[stage.id] = len(targets) + sum(side_reads(b) for b in outputs) + (not able)
    return Carriers(carrier, reads)


# --- task side: small, picklable by reference ---------------------------------------------


def select(buffer: str, carry: bool, records: Iterable) -> Iterator:
    """A buffer's data chunks from a stage's records, plus its reports if this read carries."""
    for record in records:
        if isinstance(record, OutputRecord):
            if record.buffer == buffer:
                yield record.data
        elif carry:
            yield record


def carrying(items: Iterable, fn: Callable[[Iterator], Iterable]) -> Iterator:
    """``fn`` over the data of ``items``; the carried reports among them pass through after."""
    reports: list = []
    yield from fn(split_carried(items, reports))
    yield from reports


def carrying_pairs(items: Iterable, report_key, fn: Callable[[Iterator], Iterable]) -> Iterator:
    """Like ``carrying`` before a shuffle: reports travel as ``(report_key, report)`` pairs."""
    for out in carrying(items, fn):
        yield (report_key, out) if is_report(out) else out


def split_carried(rows: Iterable, carried: list) -> Iterator:
    """The data rows of ``rows``; the carried reports among them go to ``carried``."""
    for row in rows:
        if is_report(row):
            carried.append(row)
        else:
            yield row
