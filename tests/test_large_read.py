"""Large reads of regular files under `cmt run` (native/src/large_read.hpp): split over the engine's
lanes from 4 MiB, with the single call's result, errno, bytes and file position in every case (end of
file, iovecs, errors, a partly unmapped buffer, O_DIRECT, O_APPEND, O_NONBLOCK, a reused descriptor
number), pipes, sockets, terminals, devices and small reads untouched; an I/O error in the middle."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmt.native import library_path

SOURCE = (Path(__file__).resolve().parent / "preloaded" / "large_reads.cpp").read_text()
PLAN = "h2d:0=pass;d2h:0=pass;h2h:0=pass"
# Case: whether it is split (a regular file, at least the threshold to read, a request the kernel takes).
SPLIT = {
    "read, whole file into a larger buffer": True,
    "read, whole file, cold": True,
    "read from an odd offset": True,
    "read to the end of the file": True,
    "read near the end (below the threshold)": False,
    "read at the end": False,
    "read past the end": False,
    "pread at an odd offset": True,
    "pread64 to the end": True,
    "pread, negative offset": False,
    "__read_chk": True,
    "__pread64_chk": True,
    "readv, several iovecs": True,
    "preadv at the end of the file": True,
    "preadv64": True,
    "bad descriptor": False,
    "write-only descriptor": False,
    "buffer unmapped half way": True,
    "buffer unmapped half way, pread": True,
    "buffer unmapped at its start": True,
    "O_DIRECT, aligned, to the end": True,
    "O_DIRECT, unaligned buffer": False,
    "O_DIRECT, unaligned offset": False,
    "O_APPEND descriptor": True,
    "O_NONBLOCK descriptor": True,
    "a descriptor number reused for another file": True,
    "a character device": False,
    "a socket": False,
    "a terminal": False,
    "pipe": False,
    "two readers of one open file": True,
    "readv, more than IOV_MAX iovecs": False,
    "in a forked child": False,
    "reads interrupted by a handler that reads": True,
}


def run(run_c_program, tmp_path: Path, extra: dict | None = None) -> dict[str, dict[str, int]]:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    # rotational=0: the cold case is split whatever disk the test's file is on (test_spinning_disks);
    # guard=0: every case is split or not by its own rule, never passed on by the rate guard.
    env = {"LD_PRELOAD": str(library_path()), "CMT_PLAN": PLAN, "CMT_TEST_HOOKS": "wait_setup=1,rotational=0,guard=0",
           **(extra or {})}
    proc = run_c_program(SOURCE, tmp_path, args=[str(data)], timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "done", proc.stdout + proc.stderr
    out = {}
    for line in lines:
        if line.startswith("case "):
            name, _, fields = line[5:].rpartition(" split=")
            split, alone = fields.split(" alone=")
            out[name] = {"split": int(split), "alone": int(alone)}
    assert list(out) == list(SPLIT), out
    return out


def test_large_reads_are_split_and_give_what_the_single_call_gives(run_c_program, tmp_path):
    seen = run(run_c_program, tmp_path)
    for name, counts in seen.items():
        if name == "two readers of one open file":  # one of them may find the pool taken: read alone
            assert counts["split"] >= 1 and counts["split"] + counts["alone"] == 2, counts
        elif name == "reads interrupted by a handler that reads":  # and the handlers' own, when not inside one
            assert counts["split"] >= 30, counts
        else:
            assert counts == {"split": int(SPLIT[name]), "alone": 0}, (name, counts)


@pytest.mark.parametrize("setting", [{"CMT_READ_THRESHOLD": "0"}, {"CMT_DISABLE": "1"}],
                         ids=["threshold_0", "disabled"])
def test_turned_off_reads_are_the_plain_calls(run_c_program, tmp_path, setting):
    seen = run(run_c_program, tmp_path, setting)
    assert all(c == {"split": 0, "alone": 0} for c in seen.values()), seen


def test_the_threshold_is_a_setting(run_c_program, tmp_path):
    seen = run(run_c_program, tmp_path, {"CMT_READ_THRESHOLD": str(10 << 20)})
    assert seen["read, whole file into a larger buffer"]["split"] == 1
    assert seen["__read_chk"]["split"] == 0  # 6 MiB, now below it


def test_on_spinning_disks_only_cached_ranges_are_split(run_c_program, tmp_path):
    seen = run(run_c_program, tmp_path, {"CMT_TEST_HOOKS": "wait_setup=1,rotational=1,guard=0"})
    assert seen["read, whole file, cold"]["split"] == 0  # one sequential read: the head does not seek
    assert seen["read, whole file into a larger buffer"]["split"] == 1  # written just before: cached


def fault(run_c_program, tmp_path: Path, hooks: str, call: str, start: int) -> dict[str, str]:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    env = {"LD_PRELOAD": str(library_path()), "CMT_PLAN": PLAN,
           "CMT_TEST_HOOKS": "wait_setup=1,rotational=0,guard=0," + hooks}
    proc = run_c_program(SOURCE, tmp_path, args=[str(data), "fault", call, str(start)], timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "done" and lines[-2].startswith("fault "), proc.stdout + proc.stderr
    return dict(f.split("=") for f in lines[-2].split()[1:])


MIB = 1 << 20


@pytest.mark.parametrize("call", ["read", "pread"])
def test_a_transient_error_in_the_middle_is_read_again(run_c_program, tmp_path, call):
    # The first read that reaches the offset fails with EIO; the calling thread reads on from there.
    start = 12345
    got = fault(run_c_program, tmp_path, f"read_eio={start + 5 * MIB + 777},read_eio_once=1", call, start)
    pos = start + 16 * MIB if call == "read" else 0
    assert got == {"ret": str(16 * MIB), "errno": "0", "pos": str(pos), "exact": "1", "past": "unchanged"}, got


@pytest.mark.parametrize("call", ["read", "pread"])
@pytest.mark.parametrize("at", [5 * MIB + 777, 0], ids=["middle", "start"])
def test_a_lasting_error_returns_what_the_single_call_returns(run_c_program, tmp_path, call, at):
    # Every read of that offset fails: the bytes before it (or -1 EIO), the position after them. Past
    # them the buffer is as it was, or holds the file's own bytes where later pieces had read already
    # (the documented limit, docs/storage.md): never anything else.
    start = 12345
    got = fault(run_c_program, tmp_path, f"read_eio={start + at}", call, start)
    ret = at if at else -1
    pos = (start + at if call == "read" else 0)
    assert (got["ret"], got["errno"], got["pos"], got["exact"]) == (str(ret), "0" if at else "5", str(pos), "1"), got
    assert got["past"] in ("unchanged", "file"), got
