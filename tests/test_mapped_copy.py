"""Host-to-device copies from file mappings under `cmt run` (native/src/mapped_copy.hpp): a range
that is not in the page cache is read from the file by the engine's lanes and counted 'from_file';
warm ranges, private pages the program wrote and ranges past a cut file's end come from memory; every
byte is what the mapping holds (also once a file held open is replaced under its path, or the
program closes the descriptors cmt keeps), through PROCMAP_QUERY and through /proc/self/maps alike."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from cmt.native import library_path

SOURCE = (Path(__file__).resolve().parent / "preloaded" / "mapped_copies.cpp").read_text()
PLAN = "h2d:1048576=threads:4,buffers:4,chunk_bytes:1048576;d2h:0=pass;h2h:0=pass"
# Case: whether it is read from the file when the file's pages could be dropped.
FROM_FILE = {
    "shared cold": True,
    "shared cold, the same range again": True,
    "shared warm": False,
    "shared cold, unaligned offset, async": True,
    "shared, to the last byte of the file": True,
    "shared, written through the mapping": True,
    "a range over two mappings": False,
    "private read-only cold": True,
    "cold, below 4 MiB": False,
    "private written, the range holds written pages": False,
    "private written, the range is past them": True,
    "cut file, range inside its new size": True,
    "cut file, range past its new end": False,
    "replaced: the first file": True,
    "replaced: the file now at its path": True,
    "held: the first copy": True,
    "held: its descriptors closed and reused by the program": True,
    "private written, cmt's pagemap descriptor closed and reused": False,
}


def run(run_c_program, tmp_path: Path, hooks: str = "wait_setup=1,guard=0", extra: dict | None = None,
        args: tuple[str, ...] = ()):
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    # guard=0: the rate guard, which times the copies from memory, never passes one to the driver.
    env = {"LD_PRELOAD": str(library_path()), "CMT_PLAN": PLAN, "CMT_TEST_HOOKS": hooks,
           "CMT_READ_THRESHOLD": "0", **(extra or {})}
    return run_c_program(SOURCE, tmp_path, args=[str(data), *args], timeout=240, env=env)


def cases(proc) -> dict[str, dict[str, int]]:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "done", proc.stdout + proc.stderr
    out = {}
    for line in lines:
        if line.startswith("case "):
            name, _, fields = line[5:].rpartition(" cold=")
            values = dict(f.split("=") for f in ("cold=" + fields).split())
            out[name] = {k: int(v) for k, v in values.items()}
    assert list(out) == list(FROM_FILE), out
    return out


def test_copies_from_file_mappings_are_exact_and_read_cold_ranges_from_the_file(run_c_program, tmp_path):
    seen = cases(run(run_c_program, tmp_path))
    for name, counts in seen.items():
        expect_file = FROM_FILE[name] and counts["cold"] == 1
        assert (counts["from_file"], counts["accelerated"]) == ((1, 0) if expect_file else (0, 1)), (name, counts)
    if seen["shared cold"]["cold"]:
        # O_DIRECT the first time; a range read again goes through the page cache (and is warm after).
        assert seen["shared cold"]["direct"] == 1 and seen["shared cold, the same range again"]["direct"] == 0, seen
    if not any(c["cold"] for c in seen.values()):
        pytest.skip("the page cache of this file system cannot be dropped (tmpfs?): nothing was cold")


def test_without_procmap_query_the_parsed_maps_serve_alike(run_c_program, tmp_path):
    # Kernels before 6.11: /proc/self/maps parsed and kept. A kept answer that is out of date (the
    # cases map one file after another at the same address) may only make a copy come from memory.
    seen = cases(run(run_c_program, tmp_path, "wait_setup=1,guard=0,maps=1"))
    for name, counts in seen.items():
        assert counts["from_file"] + counts["accelerated"] == 1, (name, counts)
        if not FROM_FILE[name]:
            assert counts["from_file"] == 0, (name, counts)
    if any(c["cold"] for c in seen.values()):
        assert seen["shared cold"]["from_file"] == 1, seen


def test_turned_off_every_copy_comes_from_memory(run_c_program, tmp_path):
    seen = cases(run(run_c_program, tmp_path, extra={"CMT_FROM_FILE": "0"}))
    assert all((c["from_file"], c["accelerated"], c["direct"]) == (0, 1, 0) for c in seen.values()), seen


def test_a_copy_past_the_end_of_a_cut_mapping_faults_as_without_cmt(run_c_program, tmp_path):
    proc = run(run_c_program, tmp_path, args=("sigbus",))
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stdout, proc.stderr)


def test_a_failed_read_of_the_file_is_done_again_from_memory(run_c_program, tmp_path):
    # mapped_fail=1: each read of a mapped file puts the wrong bytes (4 KiB further on) into device
    # memory and fails; the copy from memory that follows must overwrite every one of them.
    seen = cases(run(run_c_program, tmp_path, "wait_setup=1,guard=0,mapped_fail=1"))
    assert all((c["from_file"], c["accelerated"]) == (0, 1) for c in seen.values()), seen
