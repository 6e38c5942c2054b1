"""User data files are checked row by row, in bounded memory, each problem named with its
file and line (before: datasets' tracebacks, StopIteration for an empty file, and a 1 GiB
line that drove the process to 23 GB and the OOM killer)."""

import json
import subprocess
import sys

import pytest

from rlpost.core.io.config import ConfigError
from rlpost.core.io.rows import check_json_lines, is_json_lines

GOOD = json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "holds no rows"),
        (b"\n  \n", "holds no rows"),
        (GOOD.encode() + b'{"prompt": "\xff"}\n', ":2: not UTF-8 (byte 0xff at column 13)"),
        (GOOD.encode() + b"not json\n", ":2: not JSON (Expecting value at column 1)"),
        (GOOD.encode() * 2 + b"[1, 2]\n", ":3: a row must be a JSON object, got list"),
    ],
    ids=["empty", "blank", "latin-1", "not-json", "not-object"],
)
def test_a_bad_file_is_one_line_naming_file_and_line(tmp_path, content, message):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=r"data\.path: ") as err:
        check_json_lines(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_good_rows_are_counted_and_blank_lines_skipped(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(GOOD + "\n" + GOOD)
    assert check_json_lines(path) == 2
    assert is_json_lines(path)
    (tmp_path / "array.json").write_text("[" + GOOD + "]")
    assert not is_json_lines(tmp_path / "array.json")


def test_an_oversized_row_is_refused_in_bounded_memory(tmp_path):
    """A 256 MiB row under a 4 MiB cap: refused at its line, the process never holding
    more than the cap of it (measured as the child's peak resident memory)."""
    path = tmp_path / "big.jsonl"
    with open(path, "w") as f:
        f.write(GOOD)
        f.write('{"prompt": "')
        chunk = "x" * (1 << 20)
        for _ in range(256):
            f.write(chunk)
        f.write('"}\n')
    code = (
        "import resource, sys\n"
        "from rlpost.core.io.rows import check_json_lines\n"
        "from rlpost.core.io.config import ConfigError\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        f"    check_json_lines({str(path)!r}, max_row_mb=4)\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    message, grown_mb = out.stdout.strip().splitlines()
    assert f"{path}:2: a row of over 4 MiB" in message and "data.max_row_mb" in message
    assert int(grown_mb) < 64  # the 256 MiB row was never read whole
