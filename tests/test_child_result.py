"""benchmarks/child_result.py: the benchmarks' child prints one RESULT line, the parent reads it back."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
spec = importlib.util.spec_from_file_location("child_result", BENCHMARKS / "child_result.py")
child_result = importlib.util.module_from_spec(spec)
spec.loader.exec_module(child_result)


def child(code: str) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(BENCHMARKS)!r}); import child_result; {code}"]


def test_the_parent_reads_the_childs_result_among_its_other_output():
    result, proc = child_result.run(child("print('warming up'); child_result.emit({'gbps': [1.5, 2]}); print('bye')"))
    assert result == {"gbps": [1.5, 2]} and proc.returncode == 0


def test_no_result_from_a_child_that_failed_or_printed_none():
    failed, proc = child_result.run(child("child_result.emit(1); sys.exit('broke')"))
    assert failed is None and "broke" in proc.stderr
    silent, _ = child_result.run(child("print('nothing to report')"))
    assert silent is None


def test_a_child_past_its_time_is_stopped_with_its_output_so_far():
    result, proc = child_result.run(child("print('started', flush=True); import time; time.sleep(30)"), timeout=2)
    assert result is None and proc.returncode is None
    assert "started" in proc.stdout and "stopped after 2 s" in proc.stderr


def test_the_childs_environment_is_the_one_given():
    result, _ = child_result.run(child("import os; child_result.emit(os.environ.get('CMT_X'))"),
                                 {"CMT_X": "7", "PATH": "/usr/bin:/bin"})
    assert result == "7"


def test_a_variant_is_a_known_name_or_its_switches_written_out():
    known = {"default": {}, "nospin": {"CMT_SPIN_US": "0"}}
    assert child_result.variant_env("nospin", known) == {"CMT_SPIN_US": "0"}
    assert child_result.variant_env("CMT_CONFIG=a=b.json+CMT_SPIN_US=20000", known) == {
        "CMT_CONFIG": "a=b.json", "CMT_SPIN_US": "20000"}
    with pytest.raises(SystemExit, match="unknown variant 'nonsense'"):
        child_result.variant_env("nonsense", known)
