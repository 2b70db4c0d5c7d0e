"""`cmt tune`: measure this machine, write its tuned file, and with `-- CMD` run CMD under it."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .. import config as cfg
from .. import cuda, launcher
from ..bench.sizes import format_size, parse_names, parse_sizes
from ..errors import CmtError
from ..options import takes_command

if TYPE_CHECKING:
    from .search import DirectionResult

# numpy and rich are imported inside the command: `cmt tune --help` needs neither.

DEFAULT_SIZES = "64K,256K,1M,4M,16M,64M,256M,1G"
DIRECTIONS = ("h2d", "d2h", "h2h")  # h2h: large host memcpy calls, measured at their own sizes (host.py)
VERIFY_MAX = 64 << 20  # correctness does not need the largest copies, and comparing them is slow


@takes_command()
@click.option("--search", "kind", type=click.Choice(["full", "instant"]), default="full", show_default=True,
              help="full: measure candidate settings per size (about a minute, at most three); instant: measure "
                   "a few things and derive the settings from a model of the pipeline (seconds).")
@click.option("--out", metavar="FILE", help="Tuned file to write [default: <config folder>/<machine>.json, which "
              "`cmt run` picks up on this machine].")
@click.option("--sizes", default=DEFAULT_SIZES, show_default=True, metavar="LIST",
              help="Copy sizes to tune h2d and d2h at (each starts a rule), a list (1M,64M) or a range (64K:1G).")
@click.option("--directions", default=",".join(DIRECTIONS), show_default=True, metavar="LIST",
              help="Any of h2d, d2h and h2h (large host memcpy calls: the size from which cmt's threads beat "
                   "one thread, measured from 512K to 64M); a direction not tuned keeps the rules in force now.")
@click.option("--max-threads", type=click.IntRange(min=1), help="Most copy threads to try "
              "[default: the usable cores].")
@click.option("--device", default=0, show_default=True, type=click.IntRange(min=0), help="GPU ordinal.")
@click.option("--quick", is_flag=True, help="A smoke run: few repeats and samples. Checks the setup; the result "
              "is too noisy to keep.")
@click.option("--force", is_flag=True, help="With -- CMD: tune even if this machine already has a tuned file.")
def tune(kind, out, sizes, directions, max_threads, device, quick, force, command):
    """Tune cmt for this machine and write the tuned file that `cmt run` then uses.

    With -- CMD [ARGS...]: tune only if this machine has no tuned file yet, then run CMD under it
    exactly like `cmt run`, and exit with CMD's status.
    """
    job = _Job(kind, out, parse_sizes(sizes), parse_names(directions, DIRECTIONS, "direction"), max_threads,
               device, quick)
    if command:
        launcher.resolve_command(command)  # a typo fails now, not after the tuning
    try:
        reuse = bool(command) and not force
        selection = _tuned_already(out) if reuse else None
        if selection is None:
            selection = job.run(reuse)
        else:
            click.echo(f"cmt: using {selection.path} ({selection.reason}; --force tunes again)", err=True)
    except KeyboardInterrupt:
        written = f"{job.written} was written" if job.written else "nothing was written"
        raise CmtError(f"interrupted: {written}", exit_code=130) from None
    if command:  # exactly like `cmt run`: this process becomes CMD
        launcher.exec_command(command, launcher.preload_env(selection))


def _tuned_already(out: str | None) -> cfg.Selection | None:
    """The tuned file for this machine, if `cmt tune` made one (a shipped profile does not count)."""
    from .. import machine

    ids = machine.hardware_ids()
    if out:
        path = Path(out)
        if not path.exists():
            return None
        config = cfg.load(path)
        theirs = config.machine.get("hardware_id")
        if ids and theirs not in ids:
            return None  # another machine's: tune this one
        return cfg.Selection(config, path, "given with --out")
    for hw in ids:
        for path in cfg.matching_files(cfg.user_dir(), hw):
            try:
                return cfg.Selection(cfg.load(path), path, "tuned for this machine")
            except CmtError:
                continue  # corrupt: tune again and replace it
    return None


@dataclass
class _Row:
    direction: str
    nbytes: int
    pageable: float
    before: float
    after: float
    after_what: str


@dataclass
class _Job:
    kind: str
    out: str | None
    sizes: list[int]
    directions: list[str]
    max_threads: int | None
    device: int
    quick: bool = False
    written: Path | None = None
    rows: list[_Row] = field(default_factory=list)
    before_label: str = "defaults"

    def run(self, reuse: bool = False) -> cfg.Selection:
        """Tunes and writes the file; with `reuse`, a file already there for this machine (found
        only now that the driver named the machine) is used instead."""
        from rich.console import Console

        from .. import machine
        from ..bench import report

        cuda.require_real_driver("cmt tune")
        try:
            before = cfg.select(None, warn=False)
        except CmtError as e:  # a broken CMT_CONFIG is no reason not to tune
            before = cfg.Selection(None, None, f"built-in defaults ({e})")
        drv = cuda.load()
        dev = drv.open_device(self.device)
        try:
            fp = machine.fingerprint(drv, dev)
            machine.remember(fp)
            path = Path(self.out) if self.out else cfg.user_dir() / cfg.file_name(fp["slug"])
            if reuse and not self.out and path.is_file():
                with contextlib.suppress(CmtError):  # corrupt: tune again and replace it
                    found = cfg.Selection(cfg.load(path), path, "tuned for this machine")
                    click.echo(f"cmt: using {path} ({found.reason}; --force tunes again)", err=True)
                    return found
            cfg.ensure_writable(path)
            status = Console(stderr=True)
            status.print(f"[bold]{report.machine_text(fp)}[/]: {self.kind} search, "
                         f"{len(self.sizes)} sizes, {', '.join(self.directions)}")
            started = time.monotonic()
            config = self._measure(drv, dev, fp, before, status)
            config.extra["tuning"]["seconds"] = round(time.monotonic() - started, 1)
        finally:
            drv.close_device(dev)
        self.written = cfg.save(config, path)
        Console().print(self._table(path))
        if any(r.direction == "h2h" for r in self.rows):
            click.echo("h2h: host memcpy; 'driver' is one thread's, 'after' cmt's threads from the threshold up",
                       err=True)
        tuning = config.extra["tuning"]
        click.echo(f"wrote {path} ({self.kind} search: {tuning['seconds']:.0f} s, {tuning['copies']:,} copies)",
                   err=True)
        return cfg.Selection(config, path, f"tuned just now ({self.kind} search)")

    # -- measuring ------------------------------------------------------------------------------
    def _measure(self, drv, dev, fp: dict[str, Any], before: cfg.Selection, status) -> cfg.TunedConfig:
        from .. import machine
        from . import host, measure, model, search

        cores = machine.usable_cpus()
        grid = functools.partial(search.candidates, cores=cores, max_threads=self.max_threads)
        opts = search.QUICK if self.quick else search.DEFAULTS if self.kind == "full" else search.INSTANT
        widest = max((c.threads for n in self.sizes for c in grid(n)), default=1)
        largest = cfg.Settings(widest, max(search.BUFFER_STEPS),
                               min(search.CHUNK_RANGE[1], max(4096, max(self.sizes) // 2)))
        old = before.config or cfg.from_plan(_active_plan(), "default")
        capacity = max(max(self.sizes), max(host.SIZES) if "h2h" in self.directions else 0)
        results: dict[str, DirectionResult] = {}
        models: dict[str, dict[str, float]] = {}
        copies_per_sample = 2 if self.quick else measure.MAX_COPIES
        with measure.Measurer(drv, dev, capacity, largest, copies_per_sample) as m, \
                _progress(status) as progress:
            bar = progress.add_task(f"{self.kind} search", total=self._planned(grid, opts))

            def tick(what: str) -> None:
                progress.update(bar, advance=1, description=f"{self.kind} search: {what}")

            for d in self.directions:
                if d == "h2h":
                    results[d] = host.search_threshold(m, cores, self.max_threads, self.kind != "full", opts, tick)
                elif self.kind == "full":
                    results[d] = search.search_direction(m, d, self.sizes, grid, opts, tick)
                else:
                    tick(f"{d} probe")
                    results[d], fitted = model.search_direction(
                        m, m.probe(d, cores), d, self.sizes, grid, opts, tick,
                        prior=functools.partial(_settings_of, old, d))
                    models[d] = fitted.to_json()
            for d, r in results.items():
                for x in r.sizes:
                    if r.threshold is not None and x.nbytes >= r.threshold and x.settings is not None:
                        tick(f"{d} {format_size(x.nbytes)} verify")
                        m.verify(d, min(x.nbytes, VERIFY_MAX), x.settings)
            self._compare(m, results, _with_host_rules(old), before, opts, tick)
            copies = m.count
        rules = {d: search.rules(results[d]) if d in results else old.rules.get(d, []) for d in DIRECTIONS}
        tuning: dict[str, Any] = {
            "search": self.kind, "quick": self.quick, "sizes": self.sizes, "directions": self.directions,
            "cores": cores, "max_threads": self.max_threads, "copies": copies, "before": before.reason,
            "threshold": {d: r.threshold for d, r in results.items()},
            "results": [{"direction": x.direction, "bytes": x.nbytes, "pageable_gbps": round(x.pageable_gbps, 2),
                         "gbps": round(x.gbps, 2), "candidates": x.candidates, "samples": x.measurements,
                         **({"settings": x.settings.as_dict()} if x.settings else {})}
                        for r in results.values() for x in r.sizes],
        }
        if models:
            tuning["model"] = models
        return cfg.TunedConfig(rules, self.kind, fp, dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                               {"tuning": tuning})

    def _planned(self, grid, opts) -> int:
        from .. import machine
        from . import host, model, search

        instant = 2 * opts.final_samples + (model.SHORTLIST + 1) * opts.shortlist_samples
        per_size = [(search.planned_measurements(len(grid(n)), opts) if self.kind == "full" else instant)
                    + opts.final_samples for n in self.sizes]
        gpu = [d for d in self.directions if d != "h2h"]
        total = len(gpu) * (sum(per_size) + 2 * opts.final_samples * opts.threshold_steps + len(self.sizes))
        if "h2h" in self.directions:
            total += host.planned_measurements(machine.usable_cpus(), self.max_threads, self.kind != "full", opts) \
                + (opts.final_samples + 1) * len(host.SIZES)
        return total

    def _compare(self, m, results: dict[str, DirectionResult], old: cfg.TunedConfig, before: cfg.Selection,
                 opts, tick) -> None:
        """The before/after rows: the driver, the configuration in force before, the new one."""
        from .search import median

        label = before.path.name if before.path else "defaults"
        for d, r in results.items():
            for x in r.sizes:
                staged_now = r.threshold is not None and x.nbytes >= r.threshold and x.settings is not None
                after = x.gbps if staged_now else x.pageable_gbps
                after_what = x.settings.label() if staged_now else "pass"
                s = _settings_of(old, d, x.nbytes)
                if s is None:
                    was = x.pageable_gbps
                elif staged_now and s == x.settings:
                    was = after
                else:
                    samples = []
                    for _ in range(opts.final_samples):
                        samples.append(m(d, x.nbytes, s))
                        tick(f"{d} {format_size(x.nbytes)} {label}")
                    was = median(samples)
                self.rows.append(_Row(d, x.nbytes, x.pageable_gbps, was, after, after_what))
        self.before_label = label

    def _table(self, path: Path):
        from rich import box
        from rich.table import Table

        t = Table(title=f"{path.name}: GB/s before ({self.before_label}) and after", title_justify="left",
                  box=box.SIMPLE_HEAD)
        for name in ("dir", "size", "driver", "before", "after", "after with", "vs driver", "vs before"):
            t.add_column(name, justify="left" if name in ("dir", "after with") else "right", no_wrap=True)
        for r in self.rows:
            t.add_row(r.direction, format_size(r.nbytes), f"{r.pageable:.1f}", f"{r.before:.1f}", f"{r.after:.1f}",
                      r.after_what, f"{r.after / r.pageable:.2f}x" if r.pageable else "-",
                      f"{r.after / r.before:.2f}x" if r.before else "-")
        return t


def _with_host_rules(config: cfg.TunedConfig) -> cfg.TunedConfig:
    """`config` as `cmt run` applies it: a file without h2h rules gets the built-in ones."""
    if config.rules.get("h2h"):
        return config
    built_in = cfg.from_plan(_active_plan()).rules["h2h"]
    return dataclasses.replace(config, rules={**config.rules, "h2h": built_in})


def _settings_of(config: cfg.TunedConfig, direction: str, nbytes: int) -> cfg.Settings | None:
    """The staging settings `config` uses for this copy (None: it passes the copy through)."""
    return config.rule_for(direction, nbytes).settings


def _active_plan() -> str:
    from .. import native

    return native.active_plan()


def _progress(console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True)
