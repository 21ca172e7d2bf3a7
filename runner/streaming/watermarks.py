"""Per-round watermarks of one streaming pipeline, computed on the driver.

Fixed before a round runs, from what the previous round left: an Impulse is at -inf until its
round committed, +inf after; a TestStream output where its last watermark event put it. An SDF
stage holds its output back to its pending residuals' earliest hold (the SDK's watermark
estimators), a stateful stage to its pending event-time timers', a GroupByKey to its buffered
panes'; other stages pass the minimum of their inputs. A GroupByKey's *input* watermark (what
fires its timers) excludes its own hold, otherwise it could never fire.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from apache_beam.utils import timestamp

from sparkbeam.translation.plan import BufferId, EdgeKind, ExecutionPlan, StagePlan

MIN = timestamp.MIN_TIMESTAMP.micros
MAX = timestamp.MAX_TIMESTAMP.micros


@dataclass(frozen=True)
class RoundWatermarks:
    """Watermarks (micros) of one round: per stage input/output, per GroupByKey input."""

    stage_input: dict[str, int] = field(default_factory=dict)
    stage_output: dict[str, int] = field(default_factory=dict)
    group_input: dict[str, int] = field(default_factory=dict)
    buffer_output: dict[str, int] = field(default_factory=dict)  # what readers of a buffer see

    def source(self) -> int:
        """The lowest output watermark in the pipeline (for progress lines)."""
        return min(self.stage_output.values(), default=MAX)


def compute(
    plan: ExecutionPlan,
    stages: list[StagePlan],
    impulse_pending: bool,
    stage_holds: dict[str, int | None],
    group_holds: dict[str, int],
    sources: Mapping[str, int] | None = None,
) -> RoundWatermarks:
    """Propagate watermarks through ``stages`` (topologically ordered); ``sources``: the
    output watermark of each TestStream buffer (``test_stream``), -inf if not given."""
    marks = RoundWatermarks()
    writers: dict[BufferId, list[str]] = {}
    for stage in stages:
        for buffer in stage.output_buffers:
            writers.setdefault(buffer, []).append(stage.id)

    def read(buffer: BufferId) -> int:
        edge = plan.edge(buffer)
        if edge.kind == EdgeKind.IMPULSE:
            wm = MIN if impulse_pending else MAX
        elif edge.kind == EdgeKind.TEST_STREAM:
            wm = (sources or {}).get(buffer, MIN)
        else:
            wm = min((marks.stage_output[s] for s in writers.get(buffer, ())), default=MAX)
            if edge.kind == EdgeKind.GROUP:
                marks.group_input[buffer] = wm
                wm = min(wm, group_holds.get(buffer, MAX))
        marks.buffer_output[buffer] = wm
        return wm

    for stage in stages:
        inputs = [read(b) for b in stage.input_buffers]
        inputs += [read(si.buffer) for si in stage.side_inputs]
        wm = min(inputs, default=MAX)
        marks.stage_input[stage.id] = wm
        hold = stage_holds.get(stage.id)
        marks.stage_output[stage.id] = wm if hold is None else min(wm, hold)
    return marks
