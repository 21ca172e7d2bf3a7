"""Compare two `PipelineShape`s: may a checkpoint of the old pipeline restore the new one?

Every piece of state the old checkpoint holds must still have an owner in the new pipeline,
under the same id, encoded the same way:

- SDF process and stateful stages are matched by stage id and owning transform. Removed,
  renamed or renumbered (a transform added before it shifted the ids) is incompatible; so is a
  changed input coder, a changed or removed output of an SDF stage (batch keeps committed round
  outputs per buffer), and a removed or re-coded state or timer. New ones start empty.
- GroupByKey edges are matched by transform name; removed, re-coded or re-windowed is
  incompatible (streaming keeps their buffered elements); new ones are fine.
- Side inputs are matched by (transform, tag); a changed buffer or coder is incompatible
  (streaming keeps the values collected so far); added or removed ones are fine.

Everything else (DoFn bodies, stateless transforms that keep the state-bearing stage ids) is
compatible. The runner decides what to do with the `Difference`s.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkbeam.translation.shape import PipelineShape, StageShape

_KIND = {"sdf": "splittable DoFn stage", "stateful": "stateful stage"}


@dataclass(frozen=True)
class Difference:
    """One change between the checkpointed and the running pipeline, in words."""

    what: str
    compatible: bool

    def __str__(self) -> str:
        return self.what if not self.compatible else f"{self.what} (compatible)"


def compare(old: PipelineShape, new: PipelineShape) -> list[Difference]:
    """Every difference between ``old`` (the checkpoint's) and ``new`` (the running) shape."""
    return _stages(old, new) + _groups(old, new) + _side_inputs(old, new)


def incompatible(differences: list[Difference]) -> list[Difference]:
    return [d for d in differences if not d.compatible]


def _stages(old: PipelineShape, new: PipelineShape) -> list[Difference]:
    result = []
    new_by_id = {s.id: s for s in new.stages}
    new_by_owner = {(s.kind, s.transform): s for s in new.stages}
    old_owners = {(s.kind, s.transform) for s in old.stages}
    for s in old.stages:
        label = f"{_KIND[s.kind]} {s.transform!r}"
        match = new_by_id.get(s.id)
        if match is None or (match.kind, match.transform) != (s.kind, s.transform):
            moved = new_by_owner.get((s.kind, s.transform))
            if moved is not None:
                result.append(Difference(
                    f"{label} moved from {s.id} to {moved.id} (its checkpointed state is kept "
                    "by stage id; adding or removing transforms before it renumbered the stages)",
                    False,
                ))  # fmt: skip
            else:
                now = f"; {s.id} now runs {match.transform!r}" if match is not None else ""
                result.append(Difference(f"{label} ({s.id}) was removed{now}", False))
            continue
        result.extend(_stage_details(label, s, match))
    for s in new.stages:
        if (s.kind, s.transform) not in old_owners and s.id not in {o.id for o in old.stages}:
            result.append(Difference(
                f"new {_KIND[s.kind]} {s.transform!r} ({s.id}) starts with empty state", True
            ))  # fmt: skip
    return result


def _stage_details(label: str, old: StageShape, new: StageShape) -> list[Difference]:
    result = []
    if old.input_coders != new.input_coders:
        result.append(Difference(
            f"input coder of {label} ({old.id}) changed from {_join(old.input_coders)} to "
            f"{_join(new.input_coders)}",
            False,
        ))  # fmt: skip
    result += _keyed(
        f"output of {label}", dict(old.output_coders), dict(new.output_coders),
        "rounds committed before have no data for it", added_ok=False,
    )  # fmt: skip
    result += _keyed(f"state of {label}", dict(old.state), dict(new.state), "starts empty")
    result += _keyed(f"timer of {label}", dict(old.timers), dict(new.timers), "starts unset")
    return result


def _keyed(
    what: str, old: dict[str, str], new: dict[str, str], when_added: str, added_ok: bool = True
) -> list[Difference]:
    """Removed and changed entries are incompatible; added ones are ``added_ok``."""
    result = []
    for name, spec in old.items():
        if name not in new:
            result.append(Difference(f"{what} {name!r} ({spec}) was removed", False))
        elif new[name] != spec:
            result.append(
                Difference(f"coder of {what} {name!r} changed from {spec} to {new[name]}", False)
            )
    for name in new.keys() - old.keys():
        result.append(Difference(f"{what} {name!r} was added; {when_added}", added_ok))
    return result


def _groups(old: PipelineShape, new: PipelineShape) -> list[Difference]:
    result = []
    new_by_name = {g.transform: g for g in new.groups}
    for g in old.groups:
        label = f"GroupByKey {g.transform!r}"
        n = new_by_name.get(g.transform)
        if n is None:
            result.append(Difference(
                f"{label} was removed (streaming keeps its buffered elements in the checkpoint)",
                False,
            ))  # fmt: skip
            continue
        if g.buffer != n.buffer:
            result.append(Difference(
                f"{label} is now edge {n.buffer!r} instead of {g.buffer!r} (streaming keeps its "
                "buffered elements under the edge id; transforms added before it renumbered it)",
                False,
            ))  # fmt: skip
        for side in ("input", "output"):  # a changed input coder is the one to name
            was, now = getattr(g, f"{side}_coder"), getattr(n, f"{side}_coder")
            if was != now:
                what = f"coder of {label} {side} changed from {was} to {now}"
                result.append(Difference(what, False))
                break
        changed = [
            f"{field} {value} -> {dict(n.windowing).get(field, '-')}"
            for field, value in g.windowing
            if dict(n.windowing).get(field) != value
        ]
        if changed:
            result.append(Difference(f"windowing of {label} changed: {'; '.join(changed)}", False))
    old_names = {g.transform for g in old.groups}
    for n in new.groups:
        if n.transform not in old_names:
            result.append(Difference(f"GroupByKey {n.transform!r} was added", True))
    return result


def _side_inputs(old: PipelineShape, new: PipelineShape) -> list[Difference]:
    result = []
    new_by_key = {(s.transform, s.tag): s for s in new.side_inputs}
    for s in old.side_inputs:
        label = f"side input {s.tag!r} of {s.transform!r}"
        n = new_by_key.get((s.transform, s.tag))
        if n is None:
            result.append(Difference(f"{label} was removed", True))
        elif n.buffer != s.buffer:
            result.append(Difference(
                f"{label} is now read from {n.buffer!r} instead of {s.buffer!r} (streaming "
                "keeps the values collected so far under the old buffer)",
                False,
            ))  # fmt: skip
        elif n.coder != s.coder:
            result.append(
                Difference(f"coder of {label} changed from {s.coder} to {n.coder}", False)
            )
    old_keys = {(s.transform, s.tag) for s in old.side_inputs}
    for n in new.side_inputs:
        if (n.transform, n.tag) not in old_keys:
            result.append(Difference(f"side input {n.tag!r} of {n.transform!r} was added", True))
    return result


def _join(coders: tuple[str, ...]) -> str:
    return ", ".join(coders) if coders else "-"
