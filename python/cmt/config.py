"""The tuned file: cmt's configuration format, written by `cmt tune`, read by `cmt run`.

A tuned file is JSON::

    {
      "format": "cmt-tuned-config",
      "version": 1,
      "created": "2026-12-02T15:00:00Z",          # informational
      "search": "full",                           # how it was made: default, instant, full, manual
      "machine": {"fingerprint": "...", "gpu": "NVIDIA H200", ...},   # informational
      "h2d": [ {"min_bytes": 0, "mode": "pass"},
               {"min_bytes": 1048576, "threads": 8, "buffers": 16, "chunk_bytes": 524288} ],
      "d2h": [ ... ]
    }

Each direction lists rules by increasing `min_bytes`; a rule covers copies from its `min_bytes`
up to the next rule's. A rule either passes copies to the driver (`"mode": "pass"`) or stages
them with the engine's settings (`Settings`): `threads` worker threads (the calling thread is one),
a ring of `buffers` pinned staging buffers of `chunk_bytes` each, each buffer carrying one DMA
filled or drained by all threads together, and `stores` ("cached", the default, or "stream":
non-temporal stores, which win on some machines and sizes). The settings' names and limits are
the native engine's (`native.settings_schema()`), so the two can never disagree. Copies below the
first rule pass through. Rules may carry measured figures (`FIGURES`), which cmt ignores when
running. Any other key is an error, with its path.

The native library never parses JSON: `to_plan()` turns the rules into the compact string it
reads from CMT_PLAN ("h2d:0=pass;h2d:1048576=threads:8,buffers:16,chunk_bytes:524288,stores:cached").

`select()` picks the file in force: --config, else CMT_CONFIG, else the user's tuned file for this
machine (`cmt tune` writes `<fingerprint slug>.json` into `user_dir()`), else a profile shipped in
cmt/profiles/ for this machine, else the library's built-in defaults. A tuned file records the
machine it was measured on (`machine.hardware_id`); files are matched to machines by that id.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import KW_ONLY, MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from . import native
from .errors import CmtError

FORMAT = "cmt-tuned-config"
VERSION = 1
DIRECTIONS = ("h2d", "d2h")  # host<->GPU copies: what `cmt tune` and the benches measure
# Every list of rules a tuned file may have: the GPU directions, and large host memcpy calls ("h2h",
# native/src/host_copy.hpp: threads, and chunk_bytes as the piece each thread takes). A file without
# "h2h" gets the built-in rules; [{"min_bytes": 0, "mode": "pass"}] turns them off.
RULE_LISTS = (*DIRECTIONS, "h2h")
# What a rule may carry besides its settings: figures `cmt tune` measured (ignored when running).
FIGURES = ("gbps", "gain", "pageable_gbps", "measured_bytes")
# A tuned file's other top-level keys (informational).
TOP_LEVEL = ("format", "version", "created", "search", "machine", "source", "note", "tuning", "node_threads",
             *RULE_LISTS)
MAX_NODE_THREADS = 4096
MAX_FILE_BYTES = 1 << 20  # a tuned file is a few KiB; anything larger is not one


@dataclass(frozen=True)
class Settings:
    """How the engine stages a copy: the native table SETTINGS_TABLE (native/src/types.hpp), field
    for field, in its order and with its defaults. A field with a default may be left out of a
    tuned file, and is given by keyword."""

    threads: int
    buffers: int
    chunk_bytes: int
    _: KW_ONLY
    stores: str = "cached"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_text(self) -> str:
        """The plan's text form (native/src/settings.hpp): threads:8,buffers:4,..."""
        return ",".join(f"{k}:{v}" for k, v in asdict(self).items())

    @classmethod
    def from_text(cls, text: str) -> Settings:
        values = dict(item.split(":", 1) for item in text.split(","))
        return cls(**{f.name: values[f.name] if f.type == "str" else int(values[f.name])
                      for f in fields(cls) if f.name in values})

    def label(self) -> str:
        """Short, for tables: 8x4x4M (threads x buffers x chunk), with ' nt' for streaming stores."""
        from .bench.sizes import format_size

        return f"{self.threads}x{self.buffers}x{format_size(self.chunk_bytes)}" + (
            " nt" if self.stores == "stream" else "")


@dataclass(frozen=True)
class Rule:
    """Copies from `min_bytes` up to the next rule's: passed to the driver (settings None) or staged."""

    min_bytes: int
    settings: Settings | None = None
    figures: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def passes(self) -> bool:
        return self.settings is None

    def plan_text(self) -> str:
        """The rule's part of the plan (native/src/plan.hpp): pass, or its settings and the driver's own
        rate that `cmt tune` measured, which the rate guard checks staging against."""
        if self.settings is None:
            return "pass"
        driver = self.figures.get("pageable_gbps")
        good = isinstance(driver, int | float) and not isinstance(driver, bool) and 0 < driver < 1e6
        return self.settings.to_text() + (f"|driver:{driver:g}" if good else "")

    def to_json(self) -> dict[str, Any]:
        base: dict[str, Any] = {"min_bytes": self.min_bytes}
        if self.settings is None:
            base["mode"] = "pass"
        else:
            base.update(self.settings.as_dict())
        return {**base, **self.figures}


@dataclass
class TunedConfig:
    rules: dict[str, list[Rule]]
    search: str = "manual"
    machine: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # informational top-level keys (TOP_LEVEL)
    # Copy threads all of this user's processes on the machine may run at once (CMT_NODE_THREADS,
    # which wins when set); None: the usable CPUs.
    node_threads: int | None = None

    def to_plan(self) -> str:
        return ";".join(f"{direction}:{r.min_bytes}=" + r.plan_text()
                        for direction in RULE_LISTS for r in self.rules.get(direction, []))

    def rule_for(self, direction: str, nbytes: int) -> Rule:
        found = Rule(0)
        for r in self.rules.get(direction, []):
            if r.min_bytes > nbytes:
                break
            found = r
        return found

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"format": FORMAT, "version": VERSION, "created": self.created,
                               "search": self.search, "machine": self.machine}
        doc.update(self.extra)
        if self.node_threads is not None:
            doc["node_threads"] = self.node_threads
        for direction in RULE_LISTS:
            if direction in DIRECTIONS or self.rules.get(direction):
                doc[direction] = [r.to_json() for r in self.rules.get(direction, [])]
        return doc


def from_plan(plan: str, search: str = "default") -> TunedConfig:
    """The inverse of TunedConfig.to_plan (used to show the library's built-in defaults)."""
    rules: dict[str, list[Rule]] = {d: [] for d in RULE_LISTS}
    for part in filter(None, plan.split(";")):
        head, what = part.split("=", 1)
        direction, min_bytes = head.split(":")
        what, _, driver = what.partition("|driver:")
        figures = {"pageable_gbps": float(driver)} if driver else {}
        rules[direction].append(Rule(int(min_bytes), None if what == "pass" else Settings.from_text(what), figures))
    return TunedConfig(rules, search)


def _int(value: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise CmtError(f"{where}: expected an integer from {lo} to {hi}, got {value!r}")
    return value


def _unknown(keys: Any, known: Any, where: str) -> None:
    extra = sorted(set(keys) - set(known))
    if extra:
        import difflib

        close = difflib.get_close_matches(extra[0], list(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise CmtError(f"{where}.{extra[0]}: unknown key{hint}; expected one of {', '.join(known)}")


def _parse_settings(raw: dict[str, Any], where: str) -> Settings:
    """The rule's settings, checked against the engine's own limits and choices."""
    schema = {f["name"]: f for f in native.settings_schema()}
    values: dict[str, Any] = {}
    for f in fields(Settings):
        spec = schema[f.name]
        if f.name not in raw:
            if f.default is MISSING:
                raise CmtError(f"{where}.{f.name}: missing")
            continue
        value = raw[f.name]
        if "choices" in spec:
            if value not in spec["choices"]:
                raise CmtError(f"{where}.{f.name}: expected one of {', '.join(map(repr, spec['choices']))}, "
                               f"got {value!r}")
            values[f.name] = value
        else:
            values[f.name] = _int(value, f"{where}.{f.name}", spec["min"], spec["max"])
    return Settings(**values)


def _parse_rule(raw: Any, where: str) -> Rule:
    if not isinstance(raw, dict):
        raise CmtError(f"{where}: expected an object, got {type(raw).__name__}")
    setting_names = [f.name for f in fields(Settings)]
    _unknown(raw, ["min_bytes", "mode", *setting_names, *FIGURES], where)
    min_bytes = _int(raw.get("min_bytes"), f"{where}.min_bytes", 0, 1 << 62)
    figures = {k: v for k, v in raw.items() if k in FIGURES}
    mode = raw.get("mode", "stage")
    if mode == "pass":
        given = [k for k in setting_names if k in raw]
        if given:
            raise CmtError(f"{where}.{given[0]}: a pass rule takes no settings")
        return Rule(min_bytes, None, figures)
    if mode != "stage":
        raise CmtError(f"{where}.mode: expected 'pass' or 'stage', got {mode!r}")
    return Rule(min_bytes, _parse_settings(raw, where), figures)


def parse(doc: Any, source: str = "tuned file") -> TunedConfig:
    """Validates a tuned file's JSON document; every problem is a CmtError naming where it is."""
    if not isinstance(doc, dict):
        raise CmtError(f"{source}: expected a JSON object")
    if doc.get("format") != FORMAT:
        raise CmtError(f"{source}: not a cmt tuned file (format is {doc.get('format')!r}, expected {FORMAT!r})")
    version = doc.get("version")
    if version != VERSION:
        raise CmtError(f"{source}: version {version!r} is not supported (this cmt reads version {VERSION})")
    _unknown(doc, TOP_LEVEL, source)
    rules: dict[str, list[Rule]] = {}
    for direction in RULE_LISTS:
        raw = doc.get(direction, [])
        if not isinstance(raw, list):
            raise CmtError(f"{source}: {direction}: expected a list of rules")
        parsed = [_parse_rule(r, f"{source}: {direction}[{i}]") for i, r in enumerate(raw)]
        for a, b in zip(parsed, parsed[1:], strict=False):
            if b.min_bytes <= a.min_bytes:
                raise CmtError(f"{source}: {direction}: rules must have increasing min_bytes "
                               f"({a.min_bytes} then {b.min_bytes})")
        rules[direction] = parsed
    machine = doc.get("machine", {})
    if not isinstance(machine, dict):
        raise CmtError(f"{source}: machine: expected an object")
    node_threads = doc.get("node_threads")
    if node_threads is not None:
        node_threads = _int(node_threads, f"{source}: node_threads", 1, MAX_NODE_THREADS)
    known = {"format", "version", "created", "search", "machine", "node_threads", *RULE_LISTS}
    return TunedConfig(rules, str(doc.get("search", "manual")), machine, str(doc.get("created", "")),
                       {k: v for k, v in doc.items() if k not in known}, node_threads)


def load(path: str | os.PathLike) -> TunedConfig:
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)  # never the whole of /dev/zero
    except FileNotFoundError:
        raise CmtError(f"tuned file {p} does not exist") from None
    except IsADirectoryError:
        raise CmtError(f"tuned file {p} is a directory") from None
    except OSError as e:
        raise CmtError(f"cannot read tuned file {p}: {e.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise CmtError(f"tuned file {p} is larger than {MAX_FILE_BYTES >> 20} MiB: not a tuned file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CmtError(f"tuned file {p} is not UTF-8 text (byte {e.start}): not a tuned file") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise CmtError(f"tuned file {p} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    return parse(doc, str(p))


def save(config: TunedConfig, path: str | os.PathLike) -> Path:
    """Writes atomically: a reader (or an interrupted writer) never sees half a file."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(config.to_json(), indent=2) + "\n")
        os.replace(tmp, p)
    except OSError as e:
        raise CmtError(f"cannot write tuned file {p}: {e.strerror or e}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()  # interrupted or failed: no stray temporary file
    return p


def ensure_writable(path: str | os.PathLike) -> Path:
    """Proves the tuned file's folder writable before minutes of measuring, not after."""
    p = Path(path)
    probe = p.with_name(f".{p.name}.{os.getpid()}.probe")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise CmtError(f"cannot write tuned file {p}: {e.strerror or e}") from None
    return p


# -- where tuned files live and which one is in force ------------------------------------------
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"  # known machines, shipped with cmt


def user_dir() -> Path:
    """Where `cmt tune` writes tuned files: $XDG_CONFIG_HOME/cmt, else ~/.config/cmt."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "cmt"


def file_name(slug: str) -> str:
    """A tuned file is named after the machine's fingerprint slug: nvidia-h200-pcie5x16-<id>.json."""
    return f"{slug}.json"


def matching_files(folder: Path, hardware_id: str) -> list[Path]:
    """Files in `folder` named for `hardware_id` (the slug ends with it)."""
    try:
        return sorted(p for p in folder.glob(f"*{hardware_id}.json") if p.is_file())
    except OSError:
        return []


@dataclass
class Selection:
    """The configuration in force and why it was chosen."""

    config: TunedConfig | None  # None: the library's built-in defaults
    path: Path | None
    reason: str
    warnings: list[str] = field(default_factory=list)


def _machine_ids() -> list[str]:
    """This machine's hardware ids, cheaply and without CUDA; [] when unknown (never raises)."""
    try:
        from . import machine
    except ImportError:
        return []
    return machine.hardware_ids()


def _foreign_warning(config: TunedConfig, path: Path, ids: list[str]) -> list[str]:
    theirs = config.machine.get("hardware_id")
    if not isinstance(theirs, str) or not theirs or not ids or theirs in ids:
        return []
    return [f"{path} was tuned for another machine ({config.machine.get('gpu', 'unknown GPU')}, id {theirs}; "
            f"this one is {', '.join(ids)}): using it anyway"]


def _explicit(path: str, reason: str) -> Selection:
    config = load(path)
    return Selection(config, Path(path), reason, _foreign_warning(config, Path(path), _machine_ids()))


def _first_loadable(paths: list[Path], reason: str, warnings: list[str]) -> Selection | None:
    """An automatically found file that is corrupt is skipped with a warning, never fatal."""
    for p in paths:
        try:
            return Selection(load(p), p, reason, warnings)
        except CmtError as e:
            warnings.append(f"ignoring {e}")
    return None


def select(cli_path: str | None = None, warn: bool = True) -> Selection:
    """--config beats CMT_CONFIG beats the user's tuned file for this machine (from `cmt tune`)
    beats a shipped profile for this machine beats the built-in defaults. Prints warnings (a
    foreign or corrupt file) on stderr unless `warn` is False."""
    if cli_path:
        chosen = _explicit(cli_path, "given with --config")
    elif os.environ.get("CMT_CONFIG"):
        chosen = _explicit(os.environ["CMT_CONFIG"], "named by CMT_CONFIG")
    else:
        chosen = _by_fingerprint()
    if warn:
        for w in chosen.warnings:
            print(f"cmt: warning: {w}", file=sys.stderr)
    return chosen


def _by_fingerprint() -> Selection:
    ids = _machine_ids()
    warnings: list[str] = []
    for folder, why in ((user_dir(), "tuned for this machine by `cmt tune`"),
                        (PROFILES_DIR, "shipped profile for this machine")):
        for hw in ids:
            found = _first_loadable(matching_files(folder, hw), f"{why} (id {hw})", warnings)
            if found:
                return found
    why = "no tuned file for this machine" if ids else "this machine could not be identified without CUDA"
    return Selection(None, None, f"{why}: built-in defaults", warnings)
