"""The coders an edge's bytes travel in: one per edge, or a transcoding the runner does.

The SDK writes an edge's elements in the coder of its input PCollection and reads them in that
of its output PCollection. Beam fixes a mismatch at a Flatten (``fix_flatten_coders``); at a
Reshuffle or GroupByKey, which sparkbeam runs itself, they differ too (a key typed ``Any`` is a
pickle before and the deterministic coder after). Where both sides agree the runner moves the
bytes untouched in Beam's "safe" coders; where they differ the edge names the SDK's own
coders and the runner transcodes each element.
"""

from __future__ import annotations


def same_coder(coders, a: str, b: str) -> bool:
    """True when coder ids ``a`` and ``b`` encode every value to the same bytes."""
    if a == b:
        return True
    ca, cb = coders[a], coders[b]
    if ca.spec.urn != cb.spec.urn or ca.spec.payload != cb.spec.payload:
        return False
    if len(ca.component_coder_ids) != len(cb.component_coder_ids):
        return False
    return all(
        same_coder(coders, x, y) for x, y in zip(ca.component_coder_ids, cb.component_coder_ids)
    )


def same_grouped_coders(coders, pre: str, post: str) -> bool:
    """True when a GroupByKey's output coder (KV[K, Iterable[V]]) matches its input's (KV[K, V]).

    Both are windowed-value coders: (KV, window); the windows must match too."""
    pre_wv, post_wv = coders[pre], coders[post]
    if pre_wv.spec.urn != post_wv.spec.urn or pre_wv.spec.payload != post_wv.spec.payload:
        return False
    pre_parts, post_parts = list(pre_wv.component_coder_ids), list(post_wv.component_coder_ids)
    if len(pre_parts) != len(post_parts) or not pre_parts:
        return False
    if not all(same_coder(coders, x, y) for x, y in zip(pre_parts[1:], post_parts[1:])):
        return False
    pre_kv, post_kv = coders[pre_parts[0]], coders[post_parts[0]]
    if len(pre_kv.component_coder_ids) != 2 or len(post_kv.component_coder_ids) != 2:
        return False
    key_in, value_in = pre_kv.component_coder_ids
    key_out, values_out = post_kv.component_coder_ids
    iterable = coders[values_out]
    return (
        pre_kv.spec.urn == post_kv.spec.urn
        and same_coder(coders, key_in, key_out)
        and len(iterable.component_coder_ids) == 1
        and same_coder(coders, value_in, iterable.component_coder_ids[0])
    )
