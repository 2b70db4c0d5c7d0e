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
them with `threads` worker threads (the calling thread is one, 1..64) and a ring of `buffers`
pinned staging buffers (1..64) of `chunk_bytes` each (4 KiB..256 MiB); each buffer carries one
DMA, filled or drained by all threads together. `"stores": "stream"` (optional; default
`"cached"`) fills or drains the buffers with non-temporal stores, which wins on some machines and
sizes (cmt tune tries it). Copies below the first rule
pass through. Rules may carry measured figures (`gbps`, `gain`), which cmt ignores when running.

The native library never parses JSON: `to_plan()` turns the rules into the compact string it
reads from CMT_PLAN ("h2d:0=pass;h2d:1048576=8,16,524288;...").

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CmtError

FORMAT = "cmt-tuned-config"
VERSION = 1
DIRECTIONS = ("h2d", "d2h")
MAX_THREADS = 64
MAX_BUFFERS = 64
MIN_CHUNK = 4096
MAX_CHUNK = 256 << 20


@dataclass(frozen=True)
class Rule:
    min_bytes: int
    threads: int = 0  # 0: pass through
    buffers: int = 0
    chunk_bytes: int = 0
    stream_stores: bool = False  # "stores": "stream": fill/drain buffers with non-temporal stores
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def passes(self) -> bool:
        return self.threads == 0

    def to_json(self) -> dict[str, Any]:
        base: dict[str, Any] = {"min_bytes": self.min_bytes}
        if self.passes:
            base["mode"] = "pass"
        else:
            base.update(threads=self.threads, buffers=self.buffers, chunk_bytes=self.chunk_bytes)
            if self.stream_stores:
                base["stores"] = "stream"
        return {**base, **self.extra}


@dataclass
class TunedConfig:
    rules: dict[str, list[Rule]]
    search: str = "manual"
    machine: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_plan(self) -> str:
        parts = []
        for direction in DIRECTIONS:
            for r in self.rules.get(direction, []):
                what = "pass" if r.passes else f"{r.threads},{r.buffers},{r.chunk_bytes}" + (
                    ",stream" if r.stream_stores else "")
                parts.append(f"{direction}:{r.min_bytes}={what}")
        return ";".join(parts)

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
        for direction in DIRECTIONS:
            doc[direction] = [r.to_json() for r in self.rules.get(direction, [])]
        return doc


_RULE_KEYS = {"min_bytes", "mode", "threads", "buffers", "chunk_bytes", "stores"}


def _int(value: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise CmtError(f"{where}: expected an integer from {lo} to {hi}, got {value!r}")
    return value


def _parse_rule(raw: Any, where: str) -> Rule:
    if not isinstance(raw, dict):
        raise CmtError(f"{where}: expected an object, got {type(raw).__name__}")
    min_bytes = _int(raw.get("min_bytes"), f"{where}.min_bytes", 0, 1 << 62)
    extra = {k: v for k, v in raw.items() if k not in _RULE_KEYS}
    mode = raw.get("mode", "stage")
    if mode == "pass":
        return Rule(min_bytes, extra=extra)
    if mode != "stage":
        raise CmtError(f"{where}.mode: expected 'pass' or 'stage', got {mode!r}")
    threads = _int(raw.get("threads"), f"{where}.threads", 1, MAX_THREADS)
    buffers = _int(raw.get("buffers"), f"{where}.buffers", 1, MAX_BUFFERS)
    chunk = _int(raw.get("chunk_bytes"), f"{where}.chunk_bytes", MIN_CHUNK, MAX_CHUNK)
    stores = raw.get("stores", "cached")
    if stores not in ("cached", "stream"):
        raise CmtError(f"{where}.stores: expected 'cached' or 'stream', got {stores!r}")
    return Rule(min_bytes, threads, buffers, chunk, stores == "stream", extra)


def parse(doc: Any, source: str = "tuned file") -> TunedConfig:
    """Validates a tuned file's JSON document; every problem is a CmtError naming where it is."""
    if not isinstance(doc, dict):
        raise CmtError(f"{source}: expected a JSON object")
    if doc.get("format") != FORMAT:
        raise CmtError(f"{source}: not a cmt tuned file (format is {doc.get('format')!r}, expected {FORMAT!r})")
    version = doc.get("version")
    if version != VERSION:
        raise CmtError(f"{source}: version {version!r} is not supported (this cmt reads version {VERSION})")
    rules: dict[str, list[Rule]] = {}
    for direction in DIRECTIONS:
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
    known = {"format", "version", "created", "search", "machine", *DIRECTIONS}
    return TunedConfig(rules, str(doc.get("search", "manual")), machine, str(doc.get("created", "")),
                       {k: v for k, v in doc.items() if k not in known})


def load(path: str | os.PathLike) -> TunedConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise CmtError(f"tuned file {p} does not exist") from None
    except OSError as e:
        raise CmtError(f"cannot read tuned file {p}: {e.strerror}") from None
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


def from_plan(plan: str, search: str = "default") -> TunedConfig:
    """The inverse of TunedConfig.to_plan (used to show the library's built-in defaults)."""
    rules: dict[str, list[Rule]] = {d: [] for d in DIRECTIONS}
    for part in filter(None, plan.split(";")):
        head, what = part.split("=")
        direction, min_bytes = head.split(":")
        if what == "pass":
            rules[direction].append(Rule(int(min_bytes)))
        else:
            t, b, c, *flags = what.split(",")
            rules[direction].append(Rule(int(min_bytes), int(t), int(b), int(c), "stream" in flags))
    return TunedConfig(rules, search)


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
        from .tune import machine
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
