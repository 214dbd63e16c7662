"""The C kernels run under ASan and UBSan by marker, not by a hand-kept list: scripts/sanitize.sh
selects the tests marked ``kernels`` (pyproject.toml says the rule), the marked set holds the
kernels' own tests, the fuzz of frames and footers and whole compactions with and without
the kernels, every test module that needs an extension built carries the mark, and the run
fails when a function of an extension went uncalled (tests/kernel_calls.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_sanitizer_run_selects_by_the_marker() -> None:
    script = (ROOT / "scripts" / "sanitize.sh").read_text()
    command = script[script.index('"$PY" -m pytest -q'):]
    command = command[:command.index("|| status=$?")]
    assert "-m kernels" in command and '"$ROOT/tests"' in command and "tests.kernel_calls" in script
    assert not re.findall(r"tests/\w+/test_\w+\.py", command), "a test named by hand"


def _marked() -> set[str]:
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "kernels", "-p",
                          "no:cacheprovider", "tests/ledger", "tests/metadata", "tests/producer",
                          "tests/compactor/test_event_order_rules.py"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return {line.split("[")[0] for line in res.stdout.splitlines() if "::" in line}


def test_the_marked_set_holds_the_fuzz_and_whole_compactions() -> None:
    marked = _marked()
    for test in ("tests/ledger/test_fuzz_frames.py::test_lies_in_compressed_frames",
                 "tests/metadata/test_fuzz_hostile.py::test_lies_in_ledger_footers",
                 "tests/metadata/test_fuzz_hostile.py::test_lies_in_compacted_part_footers",
                 "tests/ledger/test_kernels.py::test_compaction_is_the_same_with_and_without_the_c_kernels",
                 "tests/producer/test_arrow_in.py::test_encoder_matches_encode_entry_byte_for_byte",
                 "tests/producer/test_jsonl_ingest.py::test_columns_store_and_refuse_as_the_line_by_line_path"):
        assert test in marked, test
    # and not what only passes through the kernels on the way to something else
    assert not any(t.startswith("tests/metadata/test_fuzz_hostile.py::test_lies_in_metadata") for t in marked)


def test_every_module_that_needs_an_extension_built_is_marked() -> None:
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        text = path.read_text()
        if re.search(r"\bneed_c_extension\(|\bc_extension\(", text) and path.name != "test_needs.py":
            assert "pytest.mark.kernels" in text, f"{path.relative_to(ROOT)} needs a C extension but is not marked"


_ONE_KERNEL = """
from shale.ledger import kernels

def test_one():
    assert kernels.crc32c(b"abc") == kernels.crc32c(b"abc")
"""


def test_a_run_that_leaves_a_kernel_uncalled_fails_naming_it(tmp_path: Path) -> None:
    (tmp_path / "test_one.py").write_text(_ONE_KERNEL)
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.kernel_calls",
                          "--rootdir", str(tmp_path), str(tmp_path / "test_one.py")],
                         capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 1, res.stdout + res.stderr
    assert "no test marked kernels called" in res.stdout
    named = res.stdout[res.stdout.index("no test marked kernels called"):]
    assert "shale.ledger._encoder.encode_records" in named and "shale.ledger._jsonl.scan" in named
    assert "shale.ledger._kernels.crc32c," not in named
