"""Beam's Java-backed Kafka transforms, on sparkbeam: refused at once, naming the native ones.

``apache_beam.io.kafka.ReadFromKafka`` / ``WriteToKafka`` ask Beam's Java expansion service
(fetching its jar first, ~16 s before failing offline) and would need a Java SDK harness, which
sparkbeam does not run. ``_runner_alias`` installs this guard when a program imports
``apache_beam.io.kafka``: on sparkbeam's runner ``expand`` raises one line naming
``sparkbeam.io``'s transform; other runners are untouched.
"""

from __future__ import annotations

_MARK = "_sparkbeam_guarded"


class BeamKafkaOnSparkbeamError(NotImplementedError):
    """A pipeline on SparkCheckpointRunner applies Beam's Java Kafka transform."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"apache_beam.io.kafka.{name} needs Beam's Java expansion service and a Java SDK "
            f"harness, which SparkCheckpointRunner does not run; use `from sparkbeam.io import "
            f"{name}` instead (same arguments, no Java; pip install 'sparkbeam[kafka]')."
        )


def guard(module) -> None:
    """Wrap ``expand`` of the module's ReadFromKafka and WriteToKafka (once)."""
    for name in ("ReadFromKafka", "WriteToKafka"):
        cls = getattr(module, name, None)
        if cls is None or getattr(cls, _MARK, False):
            continue
        original = cls.expand

        def expand(self, pvalueish, _original=original, _name=name):
            runner = getattr(getattr(pvalueish, "pipeline", None), "runner", None)
            if type(runner).__module__.startswith("sparkbeam."):
                raise BeamKafkaOnSparkbeamError(_name)
            return _original(self, pvalueish)

        cls.expand = expand
        setattr(cls, _MARK, True)
