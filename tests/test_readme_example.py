"""The README's stateful Spark example runs as written and prints what the README says it prints.

The code block is taken from README.md (the first ```python block under the heading
``EXAMPLE_HEADING``) and run as a script in a fresh interpreter, in an empty working directory,
the way a reader would run it after installing the package. The ```text block that follows it
in the README is the output the script must print.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

README = Path(__file__).resolve().parent.parent / "README.md"
EXAMPLE_HEADING = "## A stateful Spark job"

#: What the example must print: alice's session is closed by the watermark of micro-batch 2
#: (her last click at 30 s, the watermark at 100 s); bob's and carol's stay open until the
#: end-of-input flush, which runs as version 3.
EXPECTED = [
    "alice: 3 clicks, session closed in micro-batch 2",
    "bob: 2 clicks, session closed in micro-batch 3",
    "carol: 1 clicks, session closed in micro-batch 3",
]


def readme_blocks(heading: str) -> tuple[str, str]:
    """Return (the first ```python block, the first ```text block after it) under ``heading``
    in README.md, up to the next ``## `` heading. Fails the test when either is missing."""
    text = README.read_text(encoding="utf-8")
    start = text.find("\n" + heading + "\n")
    assert start >= 0, f"README.md has no heading {heading!r}"
    section = text[start + len(heading) + 2:]
    end = section.find("\n## ")
    if end >= 0:
        section = section[:end]
    code = re.search(r"^```python\n(.*?)^```$", section, re.DOTALL | re.MULTILINE)
    assert code, f"no ```python block under {heading!r} in README.md"
    output = re.search(r"^```text\n(.*?)^```$", section[code.end():], re.DOTALL | re.MULTILINE)
    assert output, f"no ```text block after the example under {heading!r} in README.md"
    return code.group(1), output.group(1)


def test_readme_documents_the_expected_output():
    _, output = readme_blocks(EXAMPLE_HEADING)
    assert output.splitlines() == EXPECTED


def test_readme_spark_example_runs_as_written(tmp_path):
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime: the example starts a local SparkSession")
    code, _ = readme_blocks(EXAMPLE_HEADING)
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    # The child inherits the environment (PYTHONPATH included, for a source checkout) and runs
    # with this interpreter, so it sees the statecore under test.
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=dict(os.environ),
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, f"example failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    assert proc.stdout.splitlines() == EXPECTED, proc.stdout
