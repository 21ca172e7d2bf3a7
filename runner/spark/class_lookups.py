"""PySpark names JVM classes by their simple names (``sc._jvm.PythonRDD``) each time it builds
an RDD, and py4j resolves such a name in the JVM on every use: as a class of the default
package first, then under each of PySpark's wildcard imports. Each miss makes the JVM's class
loader search every jar on its class path (about 290 for pyspark) and build an exception, so a
streaming round, which builds a few RDDs, spent a tenth of the JVM's CPU in lookups that always
give the same answer. The view installed here remembers the classes and packages a name
resolved to (for the life of the JVM they do not change); a name that resolves to nothing is
asked again, as a jar added later may bring it."""

from __future__ import annotations

from typing import Any

from py4j.java_gateway import JVMView


class RememberingJVMView(JVMView):
    """A ``JVMView`` on the same JVM view (same id, same imports) that resolves each name once."""

    def __init__(self, view: JVMView) -> None:  # noqa: D107 - shares the view's state
        self.__dict__.update(view.__dict__)
        self.__dict__["_sparkbeam_resolved"] = {}

    def __getattr__(self, name: str) -> Any:
        resolved = self.__dict__["_sparkbeam_resolved"]
        found = resolved.get(name)
        if found is None:
            found = resolved[name] = JVMView.__getattr__(self, name)
        return found


def remember_class_lookups(sc: Any) -> None:
    """Make ``sc``'s and PySpark's JVM view remember name lookups (idempotent)."""
    from pyspark import SparkContext

    view = SparkContext._jvm
    if view is None or isinstance(view, RememberingJVMView):
        return
    remembering = RememberingJVMView(view)
    SparkContext._jvm = remembering
    sc._jvm = remembering
