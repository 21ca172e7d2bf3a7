"""Fail early, in one line, when Java 17+ (needed by PySpark 4) is missing."""

import re
import shutil
import subprocess
import sys

MIN_JAVA = 17


def main() -> int:
    java = shutil.which("java")
    if java is None:
        print(
            f"sparkbeam needs Java {MIN_JAVA}+ on PATH (PySpark 4 runs Spark in a JVM), "
            "and no `java` was found. Install one, e.g. `apt-get install openjdk-17-jre-headless`, "
            "or set JAVA_HOME and put $JAVA_HOME/bin on PATH.",
            file=sys.stderr,
        )
        return 1
    out = subprocess.run([java, "-version"], capture_output=True, text=True)
    text = out.stderr + out.stdout
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not match:
        print(f"Could not read the Java version from `{java} -version`: {text!r}", file=sys.stderr)
        return 1
    major = int(match.group(1))
    if major == 1 and match.group(2):
        major = int(match.group(2))
    if major < MIN_JAVA:
        print(
            f"sparkbeam needs Java {MIN_JAVA}+ but {java} is Java {major}. "
            f"Install Java {MIN_JAVA} or newer and put it first on PATH.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
