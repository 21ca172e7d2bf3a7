"""sparkbeam: Apache Beam Python pipelines on Apache Spark.

The code lives in four sub-packages (``sparkbeam.translation``,
``sparkbeam.runner``, ``sparkbeam.sdf``, ``sparkbeam.checkpoint``); this
package only names them. Import what you need from them directly.
"""

__version__ = "0.1.0.dev0"
