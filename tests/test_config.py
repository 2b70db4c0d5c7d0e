"""The tuned-file format: validation with clear errors, round trip to the native plan string."""

from __future__ import annotations

import json

import pytest

from cmt import config as cfg
from cmt import native
from cmt.errors import CmtError

GOOD = {
    "format": "cmt-tuned-config", "version": 1, "search": "manual", "machine": {"gpu": "test"},
    "h2d": [{"min_bytes": 0, "mode": "pass"},
            {"min_bytes": 1 << 20, "threads": 4, "buffers": 8, "chunk_bytes": 1 << 18, "gbps": 40.0},
            {"min_bytes": 64 << 20, "threads": 8, "buffers": 4, "chunk_bytes": 1 << 22, "stores": "stream"}],
    "d2h": [{"min_bytes": 2 << 20, "threads": 8, "buffers": 16, "chunk_bytes": 1 << 20}],
}


def write(tmp_path, doc) -> str:
    p = tmp_path / "tuned.json"
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(p)


def test_good_file_round_trips_through_the_native_parser(tmp_path):
    conf = cfg.load(write(tmp_path, GOOD))
    plan = conf.to_plan()
    assert plan == "h2d:0=pass;h2d:1048576=4,8,262144;h2d:67108864=8,4,4194304,stream;d2h:2097152=8,16,1048576"
    native.configure(plan)
    assert native.active_plan() == plan
    assert conf.rule_for("h2d", 5 << 20).threads == 4
    assert conf.rule_for("d2h", 1 << 20).passes
    # measured figures survive a save/load
    saved = cfg.save(conf, tmp_path / "again.json")
    assert cfg.load(saved).rules["h2d"][1].extra == {"gbps": 40.0}
    assert cfg.load(saved).to_plan() == plan and cfg.from_plan(plan).to_plan() == plan


@pytest.mark.parametrize("doc,message", [
    ("{not json", "not valid JSON"),
    ([], "expected a JSON object"),
    ({**GOOD, "format": "other"}, "not a cmt tuned file"),
    ({**GOOD, "version": 2}, "version 2 is not supported"),
    ({**GOOD, "h2d": {}}, "expected a list of rules"),
    ({**GOOD, "h2d": [{"min_bytes": 0, "threads": 0, "buffers": 1, "chunk_bytes": 4096}]}, "h2d[0].threads"),
    ({**GOOD, "h2d": [{"min_bytes": 0, "threads": 2, "buffers": 0, "chunk_bytes": 4096}]}, "h2d[0].buffers"),
    ({**GOOD, "h2d": [{"min_bytes": 0, "threads": 2, "buffers": 65, "chunk_bytes": 4096}]}, "h2d[0].buffers"),
    ({**GOOD, "d2h": [{"min_bytes": 0, "threads": 2, "buffers": 2, "chunk_bytes": 100}]}, "d2h[0].chunk_bytes"),
    ({**GOOD, "d2h": [{"min_bytes": 5, "mode": "pass"}, {"min_bytes": 5, "mode": "pass"}]}, "increasing"),
    ({**GOOD, "d2h": [{"min_bytes": -1, "mode": "pass"}]}, "d2h[0].min_bytes"),
    ({**GOOD, "d2h": [{"min_bytes": 0, "mode": "fast"}]}, "expected 'pass' or 'stage'"),
    ({**GOOD, "d2h": [{"min_bytes": 0, "threads": 2, "buffers": 2, "chunk_bytes": 4096, "stores": "nt"}]}, "stores"),
    ({**GOOD, "d2h": [{"min_bytes": 0, "threads": True, "buffers": 2, "chunk_bytes": 4096}]}, "threads"),
])
def test_corrupt_files_get_clear_errors(tmp_path, doc, message):
    with pytest.raises(CmtError, match=message.replace("[", r"\[").replace("]", r"\]")):
        cfg.load(write(tmp_path, doc))


def test_missing_file(tmp_path):
    with pytest.raises(CmtError, match="does not exist"):
        cfg.load(tmp_path / "nope.json")


def test_unwritable_destination(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CmtError, match="cannot write tuned file"):
        cfg.save(cfg.parse(GOOD), blocker / "sub" / "tuned.json")


def test_selection_order(tmp_path, monkeypatch):
    path = write(tmp_path, GOOD)
    monkeypatch.delenv("CMT_CONFIG", raising=False)
    # A machine without tuned files or a shipped profile (the H200 has one: see test_config_select).
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setattr(cfg, "_machine_ids", lambda: [])
    assert cfg.select(None).config is None
    monkeypatch.setenv("CMT_CONFIG", path)
    assert cfg.select(None).reason == "named by CMT_CONFIG"
    assert cfg.select(path).reason == "given with --config"


def test_native_defaults_parse_back():
    plan = native.active_plan()
    assert cfg.from_plan(plan).to_plan() == plan


@pytest.mark.parametrize("plan", ["x2d:0=pass", "h2d:0=1,1", "h2d:0=65,65,4096", "h2d:0=2,2,1024", "h2d:a=pass",
                                  "h2d:0=2,2,4096,fast"])
def test_native_rejects_bad_plans(plan):
    with pytest.raises(CmtError):
        native.configure(plan)
