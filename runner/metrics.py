"""Merging MonitoringInfos from many Spark tasks into one value per metric.

Beam's ``monitoring_infos.consolidate`` combines counters, distributions and
gauges; string sets and bounded tries it leaves as separate values (its
runners run one bundle at a time). Across Spark tasks they must be merged
too, or a string set would show one task's strings only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from apache_beam.coders import IterableCoder, StrUtf8Coder
from apache_beam.metrics import monitoring_infos as mi
from apache_beam.portability.api import metrics_pb2

_STRINGS = IterableCoder(StrUtf8Coder())


def merge_monitoring_infos(infos: Iterable[metrics_pb2.MonitoringInfo]) -> list:
    """One MonitoringInfo per (urn, labels): Beam's combiners plus set/trie unions."""
    grouped: dict = defaultdict(list)
    rest = []
    for info in infos:
        if mi.is_string_set(info) or mi.is_bounded_trie(info):
            grouped[mi.to_key(info)].append(info)
        else:
            rest.append(info)
    merged = list(mi.consolidate(rest))
    for values in grouped.values():
        first = values[0]
        if mi.is_string_set(first):
            strings: set[str] = set()
            for v in values:
                strings |= mi.extract_string_set_value(v)
            payload = _STRINGS.encode(sorted(strings))
        else:
            trie = mi.extract_bounded_trie_value(first)
            for v in values[1:]:
                trie = trie.combine(mi.extract_bounded_trie_value(v))
            payload = trie.to_proto().SerializeToString()
        merged.append(
            metrics_pb2.MonitoringInfo(
                urn=first.urn, type=first.type, labels=dict(first.labels), payload=payload
            )
        )
    return merged
