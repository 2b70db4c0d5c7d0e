"""`cmt bench`: `copy` (the default) sweeps copy sizes; `workloads` times real programs with and without cmt;
`load` measures copies on a loaded machine (busy CPUs, both directions, many processes and threads); `io`
measures storage to host or GPU memory, gdsio-style."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .. import config as cfg
from .. import cuda, native, plotting
from ..errors import CmtError
from ..options import config_option
from . import DIRECTIONS, MODES, load_report, workloads
from . import load as load_bench
from .sizes import format_size, parse_names, parse_sizes

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

# numpy, rich's tables and matplotlib are imported inside the commands: the help and
# `cmt bench workloads --list` need none of them.

DEFAULT_SIZES = "4K,64K,256K,1M,4M,16M,64M,256M,1G"
QUICK_SIZES = "4K,1M,16M,256M"


class _CopyByDefault(click.Group):
    """`cmt bench [OPTIONS]` means `cmt bench copy [OPTIONS]`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("-h", "--help")):
            args = ["copy", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_CopyByDefault, context_settings={"help_option_names": ["-h", "--help"]})
def bench():
    """Measure copy bandwidth (`copy`, the default), real workloads (`workloads`), copies on a loaded
    machine (`load`) and storage reads and writes (`io`) with and without cmt."""


def _out_option(kind: str):
    return click.option("--out", "out_dir", metavar="DIR", default=None,
                        help=f"Folder for {kind}.json and {kind}.png [default: ./cmt-bench-DATE].")


_QUICK_HELP = {"copy": "A one-minute smoke run: fewer sizes and repeats.",
               "workloads": "A one-minute smoke run: smaller data, and without --only a few workloads.",
               "load": "A smoke run: small copies, few repeats, one round, busy levels 0 and 8."}


def _common_options(kind: str):
    def wrap(f):
        for opt in reversed([
            _out_option(kind),
            click.option("--json", "as_json", is_flag=True, help="Print the JSON result on stdout instead of tables."),
            click.option("--no-plot", is_flag=True, help="Do not write the PNG plot."),
            click.option("--quick", is_flag=True, help=_QUICK_HELP[kind]),
            config_option("Tuned file for cmt"),
            click.option("--device", default=0, show_default=True, type=click.IntRange(min=0), help="GPU ordinal."),
        ]):
            f = opt(f)
        return f
    return wrap


def _out_path(out_dir: str | None) -> Path:
    """The output folder, checked writable now but made only by `_finish`."""
    from . import report

    return report.check_out_dir(out_dir or f"cmt-bench-{dt.datetime.now():%Y%m%d-%H%M%S}")


def _engine_info(selection: cfg.Selection) -> dict[str, Any]:
    """The cmt configuration measured: the tuned file if any, and the plan string in force."""
    lib = native.load()
    if selection.config is not None:
        native.configure(selection.config.to_plan())
    return {"version": lib.cmt_version().decode(), "library": str(native.library_path()),
            "config": str(selection.path) if selection.path else None, "reason": selection.reason,
            "plan": native.active_plan()}


def _measuring_setup(config_path: str | None, out_dir: str | None, device: int):
    """What every bench starts with: the tuned file in force, the output folder (checked, not made
    yet), the GPU opened, what cmt's engine will run with, and the machine's fingerprint."""
    from .. import machine as hw

    selection = cfg.select(config_path)
    out = _out_path(out_dir)
    drv, dev = _open_gpu(device)
    return selection, out, drv, dev, _engine_info(selection), hw.fingerprint(drv, dev)


def _open_gpu(device: int) -> tuple[cuda.Driver, cuda.Device]:
    drv = cuda.load()
    return drv, drv.open_device(device)


def _progress(console: Console) -> Progress:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True)


def _finish(doc: dict[str, Any], out: Path, kind: str, as_json: bool, no_plot: bool, tables: list,
            plot=None) -> list[Path]:
    from rich.console import Console

    from . import report

    report.make_out_dir(out)
    written = [report.write_json(doc, out / f"{kind}.json")]
    if not no_plot:
        plot = plot or (report.plot_copy if kind == "copy" else report.plot_workloads)
        try:
            written.append(plot(doc, out / f"{kind}.png"))
        except plotting.Unavailable as e:  # the JSON is written all the same
            click.echo(f"cmt: {e}", err=True)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        console = Console()
        for t in tables:
            console.print(t)
    click.echo("wrote " + ", ".join(str(p) for p in written), err=True)
    return written


@bench.command("copy")
@click.option("--sizes", metavar="LIST", help=f"Copy sizes: a list (4K,1M,64M) or a power-of-two range (4K:1G) "
              f"[default: {DEFAULT_SIZES}; with --quick {QUICK_SIZES}].")
@click.option("--directions", default=",".join(DIRECTIONS), show_default=True, metavar="LIST",
              help="Any of h2d, d2h, d2h-fresh (device to never-touched host memory).")
@click.option("--modes", default=",".join(MODES), show_default=True, metavar="LIST",
              help="Any of pageable (the driver's default), pinned (the link's limit), cmt, cpu (memcpy by threads).")
@click.option("--repeats", type=click.IntRange(min=1), help="Timed repeats per measurement [default: by size].")
@click.option("--warmup", type=click.IntRange(min=0), help="Untimed copies first [default: 2; with --quick 1].")
@_common_options("copy")
def copy_cmd(sizes, directions, modes, repeats, warmup, out_dir, as_json, no_plot, quick, config_path, device):
    """Copy bandwidth by size: default pageable copy, pinned, cmt's engine and CPU memcpy."""
    from rich.console import Console

    from .. import machine as hw
    from . import copy_sweep, report

    cuda.require_real_driver("cmt bench")
    plan = copy_sweep.SweepPlan(parse_sizes(sizes or (QUICK_SIZES if quick else DEFAULT_SIZES)),
                                parse_names(directions, DIRECTIONS, "direction"),
                                parse_names(modes, MODES, "mode"),
                                copy_sweep.cpu_thread_counts(hw.usable_cpus()))
    reps = copy_sweep.QUICK if quick else copy_sweep.FULL
    reps = copy_sweep.Repetitions(warmup if warmup is not None else reps.warmup, reps.least, reps.most,
                                  reps.target_bytes, repeats)
    selection, out, drv, dev, engine, machine = _measuring_setup(config_path, out_dir, device)
    tasks = plan.tasks()
    status = Console(stderr=True)
    status.print(f"[bold]{report.machine_text(machine)}[/]; cmt plan: {engine['plan'] or '(none)'}")
    with copy_sweep.CopyBench(drv, dev, max(plan.sizes)) as bench_, _progress(status) as progress:
        bar = progress.add_task("copy sweep", total=len(tasks))

        def done(task: copy_sweep.Task, result: copy_sweep.Result) -> None:
            label = f"cpu x{task.threads}" if task.mode == "cpu" else f"{task.mode} {task.direction}"
            progress.update(bar, advance=1, description=f"{format_size(task.nbytes)} {label}: "
                                                        f"{result.median_gbps:.1f} GB/s")

        results = copy_sweep.run_sweep(bench_, tasks, reps, done)
    doc = copy_sweep.document(results, machine, engine, plan, reps, quick)
    _finish(doc, out, "copy", as_json, no_plot, report.copy_tables(doc))


def _visible_device_env(device: int) -> dict[str, str]:
    """Runs the workloads on GPU `device` (counted among the GPUs this process sees)."""
    from . import workload_runner

    env = workload_runner.plain_env()
    visible = [v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and device >= len(visible):
        raise CmtError(f"GPU {device} does not exist: CUDA_VISIBLE_DEVICES lists {len(visible)}")
    env["CUDA_VISIBLE_DEVICES"] = visible[device] if visible else str(device)
    return env


@bench.command("workloads")
@click.option("--list", "list_only", is_flag=True, help="List the workloads (with --quick: the smoke selection).")
@click.option("--only", metavar="LIST", help="Run only these workloads (comma-separated names).")
@click.option("--timeout", "timeout_s", default=300, show_default=True, type=click.IntRange(min=1),
              help="Seconds allowed to each run of a workload.")
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(min=1, max=50),
              help="Plain and cmt processes taken in turn this many times; the figures are their medians.")
@_common_options("workloads")
def workloads_cmd(list_only, only, timeout_s, rounds, out_dir, as_json, no_plot, quick, config_path, device):
    """Real programs run plainly and under `cmt run` (processes in turn, --rounds times): end-to-end and
    inner speed-ups."""
    chosen = workloads.select(only, quick)
    if list_only:
        for w in chosen:
            click.echo(f"{w.name:20} {w.description}")
        return
    from rich.console import Console

    from . import report, workload_runner

    cuda.require_real_driver("cmt bench workloads")
    selection, out, drv, dev, engine, machine = _measuring_setup(config_path, out_dir, device)
    drv.close_device(dev)  # the workloads need the GPU, not this process
    opts = workload_runner.SuiteOptions(quick, str(selection.path) if selection.path else None, timeout_s,
                                        _visible_device_env(device), rounds=rounds)
    status = Console(stderr=True)
    with _progress(status) as progress:
        bar = progress.add_task("workloads", total=len(chosen))

        def phase(w: workloads.Workload, name: str) -> None:
            progress.update(bar, description=f"{w.name}: {name}")

        def done(w: workloads.Workload, entry: dict[str, Any]) -> None:
            progress.advance(bar)
            if entry["status"] != "ok":
                status.print(f"{w.name}: {entry['status']}: {entry.get('skip') or entry.get('error')}")

        entries = workload_runner.run_suite(chosen, opts, phase, done)
    doc = workload_runner.document(entries, machine, engine, quick)
    _finish(doc, out, "workloads", as_json, no_plot, [report.workloads_table(doc)])
    failed = [e["name"] for e in entries if e["status"] in ("error", "timeout")]
    if failed:
        raise CmtError(f"{len(failed)} workload{'s' if len(failed) > 1 else ''} failed: {', '.join(failed)} "
                       f"(see {out / 'workloads.json'})", exit_code=1)


def _given(value: str | None, default: str) -> str:
    """An option's text, or its default when it was not given (an empty text is an error later)."""
    return default if value is None else value


def _gpu_list(text: str, count: int) -> list[int]:
    if text.strip() == "all":
        return list(range(count))
    gpus = load_bench.parse_counts(text, "GPU", 0)
    missing = [g for g in gpus if g >= count]
    if missing:
        raise CmtError(f"GPU {missing[0]} does not exist: {count} GPU{'s' if count != 1 else ''} found "
                       f"(numbered from 0)")
    return gpus


@bench.command("load")
@click.option("--scenarios", default=",".join(load_bench.SCENARIOS), show_default=True, metavar="LIST",
              help="Any of busy (the copy sweep while other processes burn CPUs), duplex (both directions at "
                   "once), processes (several processes copying at once), threads (several threads of one process).")
@click.option("--processes", "rounds", type=click.IntRange(min=1, max=100), metavar="N",
              help=f"Plain and cmt processes taken in turn for every measurement [default: "
                   f"{load_bench.DEFAULT_ROUNDS}; with --quick 1].")
@click.option("--busy", metavar="LIST", help=f"CPU-burning processes during the busy sweep [default: "
              f"{load_bench.DEFAULT_BUSY}; with --quick {load_bench.QUICK_BUSY}].")
@click.option("--sizes", metavar="LIST", help=f"Copy sizes of the busy sweep [default: {load_bench.DEFAULT_SIZES}; "
              f"with --quick {load_bench.QUICK_SIZES}].")
@click.option("--counts", metavar="LIST", help=f"Process counts of `processes` [default: {load_bench.DEFAULT_COUNTS}; "
              f"with --quick {load_bench.QUICK_COUNTS}].")
@click.option("--threads", default=load_bench.DEFAULT_THREADS, show_default=True, type=click.IntRange(1, 256),
              help="Threads of `threads`.")
@click.option("--copy-size", metavar="SIZE", help=f"Each copy of `duplex` and `processes` [default: "
              f"{load_bench.DEFAULT_COPY_SIZE}; with --quick {load_bench.QUICK_COPY_SIZE}].")
@click.option("--thread-size", metavar="SIZE", help=f"Each thread's copy in `threads` [default: "
              f"{load_bench.DEFAULT_THREAD_SIZE}; with --quick {load_bench.QUICK_THREAD_SIZE}].")
@click.option("--gpus", default="all", show_default=True, metavar="LIST",
              help="GPUs of the round-robin series of `processes` and `threads`, run where two or more are given.")
@click.option("--repeats", type=click.IntRange(min=1), help="Timed repeats in every process [default: 5 for the "
              "concurrent scenarios, 5-20 by size for the sweep; with --quick 2].")
@_common_options("load")
def load_cmd(scenarios, rounds, busy, sizes, counts, threads, copy_size, thread_size, gpus, repeats, out_dir,
             as_json, no_plot, quick, config_path, device):
    """Copies on a loaded machine, plain against cmt: busy CPUs, both directions, processes, threads."""
    from rich.console import Console

    from . import report
    from .sizes import parse_size

    lb = load_bench
    sweep = dict(lb.QUICK_SWEEP if quick else lb.FULL_SWEEP, fixed=repeats)
    groups = lb.QUICK_GROUPS if quick else lb.FULL_GROUPS
    plan = lb.LoadPlan(
        scenarios=parse_names(scenarios, lb.SCENARIOS, "scenario"),
        rounds=rounds or (1 if quick else lb.DEFAULT_ROUNDS),
        busy=lb.parse_counts(_given(busy, lb.QUICK_BUSY if quick else lb.DEFAULT_BUSY), "busy", 0),
        sizes=parse_sizes(_given(sizes, lb.QUICK_SIZES if quick else lb.DEFAULT_SIZES)),
        copy_bytes=parse_size(_given(copy_size, lb.QUICK_COPY_SIZE if quick else lb.DEFAULT_COPY_SIZE)),
        counts=lb.parse_counts(_given(counts, lb.QUICK_COUNTS if quick else lb.DEFAULT_COUNTS), "process count", 1),
        threads=threads,
        thread_bytes=parse_size(_given(thread_size, lb.QUICK_THREAD_SIZE if quick else lb.DEFAULT_THREAD_SIZE)),
        device=device, sweep=sweep, groups=lb.Repeats(groups.warmup, repeats or groups.timed), quick=quick,
        config_path=config_path)
    cuda.require_real_driver("cmt bench load")
    selection, out, drv, dev, engine, machine = _measuring_setup(config_path, out_dir, device)
    plan.gpus = _gpu_list(gpus, drv.device_count())
    drv.close_device(dev)  # the probes need the GPU, not this process
    status = Console(stderr=True)
    status.print(f"[bold]{report.machine_text(machine)}[/]; cmt plan: {engine['plan'] or '(none)'}")
    with _progress(status) as progress:
        bar = progress.add_task("load", total=plan.steps())
        done = [0]

        def step(text: str) -> None:
            progress.update(bar, completed=done[0], description=text)
            done[0] += 1

        rows, failures = lb.run(plan, native.plan_stages, step)
    doc = load_report.document(rows, failures, machine, engine, plan)
    _finish(doc, out, "load", as_json, no_plot, load_report.tables(doc), load_report.plot)
    if failures:
        raise CmtError(f"{len(failures)} measurement{'s' if len(failures) > 1 else ''} failed, the first: "
                       f"{failures[0]} (see {out / 'load.json'})", exit_code=1)


# -- cmt bench io -----------------------------------------------------------------------------------
IO_DEFAULTS = {"file_size": "4G", "threads": "8", "io_size": "16M,all", "repeats": 3, "batch": 1024,
               "direct_streams": "4,16"}
IO_QUICK = {"file_size": "64M", "threads": "4", "io_size": "1M,all", "repeats": 2, "batch": 256,
            "direct_streams": "4"}
def _host_fingerprint() -> dict[str, Any]:
    """The machine without a GPU (only the CPU types run)."""
    import platform

    from .. import __version__
    from .. import machine as hw

    fp: dict[str, Any] = {"gpu": "no GPU", "pcie_gen": None, "pcie_width": None, **hw.cpu_fields(),
                          "usable_cpus": hw.usable_cpus(), "memory_bytes": hw.memory_bytes(),
                          "kernel": platform.release(), "python": platform.python_version(), "cmt_version": __version__,
                          "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    fp["hardware_id"] = hw.hardware_id(fp)
    fp["slug"] = hw.slug(fp)
    return fp


@bench.command("io")
@click.option("-f", "--file", "file_path", metavar="FILE",
              help="The test file: used as it is and kept (made with --file-size if missing). Writes need --overwrite.")
@click.option("-D", "--dir", "folder", metavar="FOLDER", help="Make the test file in FOLDER; it is removed at the end.")
@click.option("-d", "--device", default=0, show_default=True, type=click.IntRange(min=0), help="GPU ordinal.")
@click.option("-w", "--threads", metavar="LIST", help=f"Threads, each with its own I/Os (gdsio -w) [default: "
              f"{IO_DEFAULTS['threads']}; with --quick {IO_QUICK['threads']}]. KvikIO's pool gets as many.")
@click.option("-s", "--file-size", metavar="SIZE", help=f"Test file size [default: {IO_DEFAULTS['file_size']}; with "
              f"--quick {IO_QUICK['file_size']}; with --file: the file's size].")
@click.option("-i", "--io-size", metavar="LIST", help=f"Bytes per I/O; `all`: each thread's whole share in one I/O "
              f"[default: {IO_DEFAULTS['io_size']}; with --quick {IO_QUICK['io_size']}].")
@click.option("-x", "--xfer", default="cpu,cpu-gpu,cpu-pinned-gpu,cmt,kvikio,cufile", show_default=True,
              metavar="LIST", help="Transfer types: cpu (host memory only), cpu-gpu (pageable host memory, then the "
              "GPU), cpu-pinned-gpu, cmt (cmt.io), kvikio, cufile; gdsio's 0, 1, 2 mean cufile, cpu, cpu-pinned-gpu. "
              "Types that cannot run here are reported as skipped.")
@click.option("-I", "--mode", "modes", default="read,write", show_default=True, metavar="LIST",
              help="read, write; or gdsio's 0 (read), 1 (write), 2 (random read), 3 (random write).")
@click.option("--random/--sequential", default=False, help="Random blocks or each thread's share in order "
              "[default: sequential].")
@click.option("-T", "--duration", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Each run (and O_DIRECT pass; not the batch) goes on this long [default: one pass over "
                   "the file].")
@click.option("--cache", metavar="LIST", help="Page-cache states: warm (the file loaded first), cold (evicted "
              "with posix_fadvise) [default: warm,cold for reads, cold for writes].")
@click.option("--repeats", type=click.IntRange(min=1), help=f"Runs of each type per scenario, taken in turn [default: "
              f"{IO_DEFAULTS['repeats']}; with --quick {IO_QUICK['repeats']}].")
@click.option("--batch", type=click.IntRange(min=0, max=65536), metavar="COUNT", help=f"The batch scenario: COUNT "
              f"random reads of --batch-size at once (cmt, KvikIO: futures) [default: {IO_DEFAULTS['batch']}; with "
              f"--quick {IO_QUICK['batch']}; 0: none].")
@click.option("--batch-size", default="64K", show_default=True, metavar="SIZE", help="Bytes per read of the batch.")
@click.option("--direct-streams", metavar="LIST", help=f"The disk's own limit: O_DIRECT passes with these numbers "
              f"of streams; `off`: none [default: {IO_DEFAULTS['direct_streams']}; with --quick "
              f"{IO_QUICK['direct_streams']}].")
@click.option("--overwrite", is_flag=True, help="Let writes overwrite the file given with --file.")
@_out_option("io")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON result on stdout (the gdsio lines go to stderr).")
@click.option("--no-plot", is_flag=True, help="Do not write the PNG plot.")
@click.option("--quick", is_flag=True, help="A smoke run: a 64 MiB file, small I/Os, two repeats.")
@config_option("Tuned file for cmt")
def io_cmd(file_path, folder, device, threads, file_size, io_size, xfer, modes, random, duration, cache, repeats,
           batch, batch_size, direct_streams, overwrite, out_dir, as_json, no_plot, quick, config_path):
    """Storage to host or GPU memory, gdsio-style: CPU only, through host memory (pageable, pinned), cmt,
    KvikIO and cuFile; warm and cold page cache; against the disk's own O_DIRECT limit."""
    from . import io as io_bench
    from . import io_files, io_report
    from .io_xfer import XFER_TYPES
    from .sizes import parse_size

    d = IO_QUICK if quick else IO_DEFAULTS
    plan = io_bench.plan_from_options(
        xfer, modes, random, _given(threads, d["threads"]), _given(io_size, d["io_size"]), cache,
        repeats or d["repeats"], duration, d["batch"] if batch is None else batch, batch_size,
        _given(direct_streams, d["direct_streams"]), device)
    size = parse_size(file_size) if file_size is not None else None
    if (file_path is None) == (folder is None):
        raise CmtError("give the test file (-f/--file FILE) or a folder to make it in (-D/--dir FOLDER)"
                       + (", not both" if file_path else ""))
    wants_gpu = any(XFER_TYPES[x].needs_gpu for x in plan.xfers)
    if wants_gpu:
        cuda.require_real_driver("cmt bench io")
    selection, out = cfg.select(config_path), _out_path(out_dir)
    drv = dev = gpu_missing = None
    if wants_gpu:
        try:
            drv = cuda.load()
        except CmtError as e:
            gpu_missing = str(e)
        else:
            dev = drv.open_device(device)
    from .. import machine as hw

    machine = hw.fingerprint(drv, dev) if dev is not None else _host_fingerprint()
    names, skipped = io_bench.available(plan.xfers, gpu_missing)
    engine = None
    if "cmt" in names:
        try:
            engine = _engine_info(selection)
        except CmtError as e:
            names.remove("cmt")
            skipped["cmt"] = str(e)
    for name, why in skipped.items():
        click.echo(f"cmt bench io: skipping {name}: {why}", err=True)
    if not names:
        raise CmtError("no transfer type can run here (" + "; ".join(f"{k}: {v}" for k, v in skipped.items()) + ")",
                       exit_code=1)

    def emit(r: dict[str, Any]) -> None:
        state = f"{r['cache']}, resident {100 * r['resident_before']:.0f}% -> {100 * r['resident_after']:.0f}%"
        click.echo(f"{r['gdsio']}  ({state})", err=as_json)

    def note(text: str) -> None:
        click.echo(f"cmt bench io: {text}", err=True)

    tf = io_files.prepare(file_path, folder, size, parse_size(d["file_size"]), "write" in plan.modes, overwrite)
    note(f"test file {tf.path} ({format_size(tf.size)}, {tf.filesystem})")
    try:
        bench_ = io_bench.IoBench(plan, tf, names, drv, dev, emit, note)
        bench_.run()
    finally:
        tf.discard()
        if dev is not None:
            drv.close_device(dev)
    doc = io_report.document(bench_, plan, tf, skipped, machine, engine, quick)
    _finish(doc, out, "io", as_json, no_plot, io_report.tables(doc), io_report.plot)
    if bench_.failures:
        raise CmtError(f"{len(bench_.failures)} failure{'s' if len(bench_.failures) > 1 else ''}, the first: "
                       f"{bench_.failures[0]['xfer']}: {bench_.failures[0]['error']} (see {out / 'io.json'})",
                       exit_code=1)
