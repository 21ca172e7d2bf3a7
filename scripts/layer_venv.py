"""Make the venv of this interpreter see another venv's packages after its own.

``make test-newest-spark`` runs the smoke tests on the newest pyspark with every other package
exactly as in ``.venv`` (constraints.txt's pins): its own venv holds only pyspark and py4j, and
the ``.pth`` written here adds ``.venv``'s site-packages (with its ``.pth`` files, such as the
editable install of sparkbeam) after them. Installing pyspark alone takes about 18 s; a second
install of everything took 113 s.

Usage: <venv>/bin/python scripts/layer_venv.py <site-packages of the base venv>
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path


def main(base_site: str) -> None:
    if not Path(base_site, "apache_beam").is_dir():
        sys.exit(f"{base_site} holds no apache_beam: run `make install` first.")
    pth = Path(sysconfig.get_paths()["purelib"]) / "sparkbeam-base-venv.pth"
    pth.write_text(f"import site; site.addsitedir({base_site!r})\n")


if __name__ == "__main__":
    main(sys.argv[1])
