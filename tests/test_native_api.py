"""The native library's C API as Python uses it: the settings' one table, the engine's block geometry,
and explicit settings checked against the engine's limits."""

from __future__ import annotations

import pytest

from cmt import native


def test_the_schema_lists_every_setting_with_its_limits_or_choices():
    schema = {f["name"]: f for f in native.settings_schema()}
    assert list(schema) == ["threads", "buffers", "chunk_bytes", "stores"]
    assert (schema["threads"]["min"], schema["threads"]["max"]) == (1, 64)
    assert (schema["chunk_bytes"]["min"], schema["chunk_bytes"]["max"]) == (4096, 256 << 20)
    assert schema["stores"]["choices"] == ["cached", "stream"]
    assert all(f["what"] for f in schema.values())


MIB = 1 << 20


def test_host_to_device_copies_ramp_up_and_run_full_blocks_to_the_end():
    blocks = native.transfer_blocks("h2d", 64 * MIB, 8 * MIB)
    assert blocks == [1 * MIB, 2 * MIB, 4 * MIB] + [8 * MIB] * 7 + [1 * MIB]
    assert sum(blocks) == 64 * MIB


def test_device_to_host_copies_also_ramp_down():
    blocks = native.transfer_blocks("d2h", 64 * MIB, 4 * MIB)
    assert blocks[:3] == [512 << 10, 1 * MIB, 2 * MIB]
    assert blocks[-4:] == [1152 << 10, 576 << 10, 320 << 10, 256 << 10]  # halving what is left, in 64 KiB units
    assert max(blocks) == 4 * MIB and sum(blocks) == 64 * MIB


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
@pytest.mark.parametrize("nbytes,chunk", [(1, 4096), (4097, 4096), (3 * MIB + 17, 1 * MIB), (1 << 30, 8 * MIB)])
def test_blocks_cover_the_copy_exactly_and_never_exceed_the_chunk(direction, nbytes, chunk):
    blocks = native.transfer_blocks(direction, nbytes, chunk)
    assert sum(blocks) == nbytes and all(0 < b <= chunk for b in blocks)


def test_a_transfer_plan_outside_the_limits_is_refused():
    with pytest.raises(Exception, match="no transfer plan"):
        native.transfer_blocks("h2d", 1 * MIB, 1024)
