"""Fail early, with a clear message, when Java 17+ (needed by Spark) is missing."""

import re
import shutil
import subprocess
import sys

MIN_JAVA = 17


def main() -> int:
    java = shutil.which("java")
    if java is None:
        print(f"error: Java {MIN_JAVA}+ is required by Spark but `java` is not on PATH.", file=sys.stderr)
        print(
            "       Install a JDK (e.g. `apt-get install openjdk-17-jre-headless`) and retry.",
            file=sys.stderr,
        )
        return 1
    banner = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', banner)
    if not match:
        print(f"error: could not read the Java version from: {banner.strip()!r}", file=sys.stderr)
        return 1
    major = int(match.group(1))
    if major == 1:  # "1.8.0" style numbering
        major = int(match.group(2) or 0)
    if major < MIN_JAVA:
        print(f"error: Java {MIN_JAVA}+ is required by Spark, found Java {major} at {java}.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
