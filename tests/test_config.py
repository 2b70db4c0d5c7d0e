"""The tuned-file format: validation with clear errors, round trip to the native plan string."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cmt import config as cfg
from cmt import native
from cmt.errors import CmtError

MAIN = "import sys; from cmt.cli import main; sys.argv[0] = 'cmt'; main()"

GOOD = {
    "format": "cmt-tuned-config", "version": 1, "search": "manual", "machine": {"gpu": "test"},
    "h2d": [{"min_bytes": 0, "mode": "pass"},
            {"min_bytes": 1 << 20, "threads": 4, "buffers": 8, "chunk_bytes": 1 << 18, "gbps": 40.0,
             "pageable_gbps": 9.5},
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
    # the driver's own rate that `cmt tune` measured goes to the rate guard (native/src/rate_guard.hpp)
    assert plan == ("h2d:0=pass;h2d:1048576=threads:4,buffers:8,chunk_bytes:262144,stores:cached|driver:9.5;"
                    "h2d:67108864=threads:8,buffers:4,chunk_bytes:4194304,stores:stream;"
                    "d2h:2097152=threads:8,buffers:16,chunk_bytes:1048576,stores:cached")
    native.configure(plan)
    # A file without host-copy rules gets the built-in ones (native/src/host_copy.hpp).
    host = cfg.from_plan(native.active_plan()).rules["h2h"]
    assert native.active_plan() == plan + ";" + ";".join(
        f"h2h:{r.min_bytes}=" + ("pass" if r.passes else r.settings.to_text()) for r in host)
    assert host[-1].min_bytes == 8 << 20 and host[-1].settings.buffers == 1
    assert conf.rule_for("h2d", 5 << 20).settings == cfg.Settings(4, 8, 1 << 18)
    assert conf.rule_for("h2d", 64 << 20).settings.stores == "stream"
    assert conf.rule_for("d2h", 1 << 20).passes
    # measured figures survive a save/load
    saved = cfg.save(conf, tmp_path / "again.json")
    assert cfg.load(saved).rules["h2d"][1].figures == {"gbps": 40.0, "pageable_gbps": 9.5}
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
    ({**GOOD, "d2h": [{"min_bytes": 0, "threads": 2, "buffers": 2}]}, "d2h[0].chunk_bytes: missing"),
    ({**GOOD, "d2h": [{"min_bytes": 0, "mode": "pass", "buffers": 2}]}, "d2h[0].buffers: a pass rule takes no"),
    ({**GOOD, "d2h": [{"min_bytes": 0, "mode": "pass", "stores": "stream"}]}, "d2h[0].stores: a pass rule"),
    ({**GOOD, "d2h": ["pass"]}, "d2h[0]: expected an object"),
    ({**GOOD, "node_threads": 0}, "node_threads: expected an integer from 1 to 4096"),
    ({**GOOD, "node_threads": "8"}, "node_threads: expected an integer"),
])
def test_corrupt_files_get_clear_errors(tmp_path, doc, message):
    with pytest.raises(CmtError, match=message.replace("[", r"\[").replace("]", r"\]")):
        cfg.load(write(tmp_path, doc))


def test_the_node_budget_of_a_tuned_file_reaches_the_program_unless_the_user_set_one(tmp_path):
    from cmt import launcher

    conf = cfg.load(write(tmp_path, {**GOOD, "node_threads": 12}))
    assert conf.node_threads == 12
    assert cfg.load(cfg.save(conf, tmp_path / "again.json")).node_threads == 12
    selection = cfg.Selection(conf, tmp_path / "tuned.json", "given with --config")
    assert launcher.preload_env(selection, base={})["CMT_NODE_THREADS"] == "12"
    assert launcher.preload_env(selection, base={"CMT_NODE_THREADS": "3"})["CMT_NODE_THREADS"] == "3"
    assert "CMT_NODE_THREADS" not in launcher.preload_env(cfg.Selection(cfg.parse(GOOD), None, "x"), base={})


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


@pytest.mark.parametrize("plan", [
    "x2d:0=pass", "h2d:a=pass", "h2d:0=threads:1,buffers:1", "h2d:0=threads:65,buffers:4,chunk_bytes:4096",
    "h2d:0=threads:2,buffers:2,chunk_bytes:1024", "h2d:0=threads:2,buffers:2,chunk_bytes:4096,stores:fast",
    "h2d:0=thraeds:2,buffers:2,chunk_bytes:4096", "h2d:0=threads:2x,buffers:2,chunk_bytes:4096",
    "h2d:0=2,2,4096",  # the old positional form
    "h2d:0=threads:2,buffers:2,chunk_bytes:4096,threads:3",  # a setting given twice
    "h2d:0=threads:2,buffers:2,chunk_bytes:4096|driver:x", "h2d:0=threads:2,buffers:2,chunk_bytes:4096|driver:-1",
    "h2d:0=pass|driver:5",
])
def test_native_rejects_bad_plans(plan):
    with pytest.raises(CmtError):
        native.configure(plan)


# -- one home for the settings ------------------------------------------------------------------
def test_settings_fields_are_the_engines_in_order():
    """cmt.config.Settings mirrors the native table (native.settings_schema()) field for field:
    the two homes of the settings must agree."""
    fields = dataclasses.fields(cfg.Settings)
    schema = native.settings_schema()
    assert [f.name for f in fields] == [f["name"] for f in schema]
    for f, spec in zip(fields, schema, strict=True):
        assert f.default == spec.get("default", dataclasses.MISSING), f.name  # the same defaults
        assert f.default in spec["choices"] if "choices" in spec else spec["min"] <= spec["max"], f.name


def test_settings_text_and_label():
    s = cfg.Settings(8, 4, 4 << 20, stores="stream")
    assert s.to_text() == "threads:8,buffers:4,chunk_bytes:4194304,stores:stream"
    assert cfg.Settings.from_text(s.to_text()) == s
    assert cfg.Settings.from_text("threads:2,buffers:4,chunk_bytes:65536") == cfg.Settings(2, 4, 65536)
    assert s.as_dict() == {"threads": 8, "buffers": 4, "chunk_bytes": 4 << 20, "stores": "stream"}
    assert s.label() == "8x4x4M nt" and cfg.Settings(2, 4, 65536).label() == "2x4x64K"
    native.configure(f"h2d:0={s.to_text()};h2h:0=pass")
    assert native.active_plan() == f"h2d:0={s.to_text()};h2h:0=pass"


# -- the command line on hand-edited and broken files -------------------------------------------
def cmt(run_python, *args: str, env: dict[str, str] | None = None):
    return run_python(MAIN, args=args, env=env)


def one_line_error(proc) -> str:
    """The only line on stderr: `cmt: ...`, exit 2, no traceback."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("cmt: "), (proc.returncode, proc.stderr)
    return lines[0]


BASE = {"format": "cmt-tuned-config", "version": 1, "h2d": [{"min_bytes": 0, "mode": "pass"}]}
STAGE = {"min_bytes": 0, "threads": 2, "buffers": 2, "chunk_bytes": 4096}


@pytest.mark.parametrize("doc, where", [
    ({**BASE, "sideways": [STAGE]}, ".sideways: unknown key"),
    ({**BASE, "H2D": [STAGE]}, ".H2D: unknown key"),
    ({**BASE, "d2h": [{**{k: v for k, v in STAGE.items() if k != "threads"}, "thraeds": 2}]},
     "d2h[0].thraeds: unknown key (did you mean 'threads'?)"),
    ({**BASE, "bogus": 1}, ".bogus: unknown key"),
    ({**BASE, "d2h": [{**STAGE, "stores": "fast"}]}, "d2h[0].stores: expected one of 'cached', 'stream', got 'fast'"),
    ({**BASE, "d2h": [{"min_bytes": 0, "mode": "pass", "threads": 2}]}, "d2h[0].threads: a pass rule takes no"),
])
def test_hand_edited_mistakes_fail_validation_with_the_keys_path(run_python, tmp_path, doc, where):
    """A misspelt direction, setting or top-level key, a bad choice, settings on a pass rule: an
    error naming the key's path, never a file that passes with its rules silently dropped."""
    path = write(tmp_path, doc)
    assert where in one_line_error(cmt(run_python, "config", "validate", path))


@pytest.fixture
def not_tuned_files(tmp_path) -> dict[str, str]:
    """Files that are no tuned file at all: binary, endless, a folder."""
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe{\"format\": \x80\x81}")
    folder = tmp_path / "folder.json"
    folder.mkdir()
    return {"binary": str(binary), "endless": "/dev/zero", "folder": str(folder)}


WAYS = {
    "validate": lambda f, out: (["config", "validate", f], {}),
    "show": lambda f, out: (["config", "show", "--config", f], {}),
    "show with CMT_CONFIG": lambda f, out: (["config", "show"], {"CMT_CONFIG": f}),
    "bench copy": lambda f, out: (["bench", "copy", "--quick", "--config", f, "--out", out], {}),
    "bench copy with CMT_CONFIG": lambda f, out: (["bench", "copy", "--quick", "--out", out], {"CMT_CONFIG": f}),
    "run": lambda f, out: (["run", "--config", f, "--", "true"], {}),
    "run with CMT_CONFIG": lambda f, out: (["run", "--", "true"], {"CMT_CONFIG": f}),
}


@pytest.mark.parametrize("way", list(WAYS))
def test_a_file_that_is_no_tuned_file_is_a_one_line_error(run_python, tmp_path, not_tuned_files, way):
    expected = {"binary": "is not UTF-8 text", "endless": "is larger than 1 MiB", "folder": "is a directory"}
    for kind, path in not_tuned_files.items():
        args, env = WAYS[way](path, str(tmp_path / "out"))
        line = one_line_error(cmt(run_python, *args, env={"XDG_CONFIG_HOME": str(tmp_path / "config"), **env}))
        assert path in line and expected[kind] in line, (kind, line)
