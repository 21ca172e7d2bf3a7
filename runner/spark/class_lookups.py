"""PySpark names JVM classes by simple name (``sc._jvm.PythonRDD``) for each RDD it builds, and
py4j resolves the name in the JVM every time: in the default package, then under each of
PySpark's wildcard imports, the class loader searching every jar (about 290) for each miss. The
view installed here remembers the class a name resolved to (it does not change in a JVM's life).
Anything else is asked again: py4j takes an unknown name for a package, and a jar added later
(``addJar``) may make it a class."""

from __future__ import annotations

from typing import Any

from py4j.java_gateway import JavaClass, JVMView


class RememberingJVMView(JVMView):
    """A ``JVMView`` on the same JVM view (same id, same imports) that resolves each name once."""

    def __init__(self, view: JVMView) -> None:  # noqa: D107 - shares the view's state
        self.__dict__.update(view.__dict__, _sparkbeam_resolved={})

    def __getattr__(self, name: str) -> Any:
        resolved = self.__dict__["_sparkbeam_resolved"]
        if name in resolved:
            return resolved[name]
        found = JVMView.__getattr__(self, name)
        if isinstance(found, JavaClass):
            resolved[name] = found
        return found


def remember_class_lookups(sc: Any) -> None:
    """Make ``sc``'s and PySpark's JVM view remember name lookups (idempotent)."""
    from pyspark import SparkContext

    if SparkContext._jvm is not None and not isinstance(SparkContext._jvm, RememberingJVMView):
        SparkContext._jvm = sc._jvm = RememberingJVMView(SparkContext._jvm)
