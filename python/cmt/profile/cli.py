"""`cmt profile`: run a command with every host<->device copy (and every host copy from the h2h
threshold up) recorded, then report them."""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import click
from rich.console import Console

from .. import config as cfg
from .. import launcher, plotting
from ..errors import CmtError
from ..options import config_option, takes_command
from . import recording, report, saving
from .chart import write_chart
from .render import render
from .trace import write_trace


def _writable(path: str, what: str, made: list[Path], replaced: bool = False) -> Path:
    """Fails before CMD runs, not after, when an output cannot be written. Folders it makes for it
    go on `made`. `replaced`: the file is written beside and renamed over (the recording), so it
    must be a regular file: never a device such as /dev/null, which the rename would replace."""
    p = Path(path)
    if p.is_dir():
        raise CmtError(f"cannot write {what} {p}: it is a directory")
    if replaced and p.exists() and not p.is_file():
        raise CmtError(f"cannot write {what} {p}: not a regular file")
    made.extend(d for d in p.parents if not d.exists())
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        existed = p.exists()
        with open(p, "ab"):
            pass
        if not existed:
            p.unlink()
    except OSError as e:
        raise CmtError(f"cannot write {what} {p}: {e.strerror or e}") from None
    return p


@contextlib.contextmanager
def _output_folders() -> Iterator[list[Path]]:
    """The folders made for the outputs: those still empty at the end (CMD not found, a bad tuned
    file, Ctrl-C, nothing to chart) are removed again."""
    made: list[Path] = []
    try:
        yield made
    finally:
        for d in sorted(set(made), key=lambda d: len(d.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()


def _console() -> Console:
    # Piped output: wide enough that the tables do not wrap (a terminal uses its own width).
    return Console() if sys.stdout.isatty() else Console(width=160)


def _bandwidth(bench: str | None, config_path: str | None, manifest: dict) -> tuple[saving.Bandwidth | None, str]:
    """What the saving is estimated with: --bench, else --config, else the run's configuration."""
    if bench:
        return saving.from_bench(bench), ""
    try:
        if config_path or "config" not in manifest:
            sel = cfg.select(config_path)
            return saving.from_config(sel.config, str(sel.path)), ""
        raw = manifest.get("config")
        config = cfg.parse(raw, "the recording's tuned file") if raw is not None else None
        return saving.from_config(config, str(manifest.get("config_source") or "recorded")), ""
    except saving.NoEstimate as e:
        return None, str(e)


def _record(command: tuple[str, ...], config_path: str | None, passthrough: bool,
            out: Path | None) -> recording.Recording:
    selection = cfg.select(config_path)
    cmd = launcher.resolve_command(command)
    with tempfile.TemporaryDirectory(prefix="cmt-profile-") as tmp:
        env = launcher.preload_env(selection)
        env["CMT_PROFILE_DIR"] = tmp
        if passthrough:
            env["CMT_DISABLE"] = "1"
        code = launcher.run(cmd, env)
        rec = recording.read_dir(Path(tmp))
        rec.manifest = recording.make_manifest(
            cmd, code, selection.config.to_json() if selection.config else None,
            str(selection.path) if selection.path else "built-in defaults")
        if out is not None:
            recording.save(Path(tmp), rec.manifest, out)
    return rec


@takes_command()
@click.option("--out", metavar="FILE", help="Save the recording (re-render it later with --report FILE).")
@click.option("--trace", "trace_path", metavar="FILE", help="Write the copies as a Chrome / Perfetto trace (JSON).")
@click.option("--chart", "chart_path", metavar="FILE",
              help="Write the share-of-bytes chart as PNG (default with --out: beside it, .png).")
@click.option("--report", "report_path", metavar="FILE", help="Report on a saved recording instead of running CMD.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@config_option("Tuned file to run with and estimate the saving from")
@click.option("--bench", "bench_path", metavar="FILE", help="A `cmt bench copy` JSON to estimate the saving from.")
@click.option("--passthrough", is_flag=True,
              help="Record only: every copy goes to the driver unchanged (a baseline for the estimate).")
def profile(out, trace_path, chart_path, report_path, as_json, config_path, bench_path, passthrough, command):
    """Record every host<->device copy of CMD, and the large host copies cmt splits (by calling library),
    and report them: cmt profile -- python train.py"""
    if report_path and command:
        raise CmtError("give either --report FILE or a command (`cmt profile -- CMD`), not both")
    if not report_path and not command:
        raise CmtError("no command given: use `cmt profile -- CMD [ARGS...]` or `cmt profile --report FILE`")
    if report_path and (out or passthrough):
        raise CmtError("--out and --passthrough need a command to run")
    with _output_folders() as made:
        code = _profile(out, trace_path, chart_path, report_path, as_json, config_path, bench_path, passthrough,
                        command, made)
    sys.exit(code)


def _profile(out, trace_path, chart_path, report_path, as_json, config_path, bench_path, passthrough, command,
             made: list[Path]) -> int:
    out_p = _writable(out, "recording", made, replaced=True) if out else None
    if out_p is not None and not chart_path:
        chart_path = str(out_p.with_suffix(".png"))
    chart_p = _writable(chart_path, "chart", made) if chart_path else None
    trace_p = _writable(trace_path, "trace", made) if trace_path else None
    if bench_path:
        saving.from_bench(bench_path)  # a bad bench file fails before the run, not after

    rec = recording.read(report_path) if report_path else _record(command, config_path, passthrough, out_p)
    bandwidth, reason = _bandwidth(bench_path, config_path, rec.manifest)
    model = report.build(rec, bandwidth, reason)
    chart_shown = None
    if chart_p is not None and model["share"]:
        try:
            write_chart(model, chart_p)
            chart_shown = str(chart_p)
        except plotting.Unavailable as e:  # the recording, trace and report all the same
            click.echo(f"cmt: {e}", err=True)
    if trace_p is not None:
        write_trace(rec, trace_p)
    if as_json:
        click.echo(json.dumps(model, indent=2))
    else:
        render(model, _console(), chart_shown)
    code = model.get("exit_code")
    return code if isinstance(code, int) and not report_path else 0
