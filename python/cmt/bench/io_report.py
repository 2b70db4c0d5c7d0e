"""What `cmt bench io` shows: per-scenario summaries (median over repeats, with the spread), cmt
against each other type and each type against the disk's O_DIRECT limit, the JSON document, the
terminal tables and the plot."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from .io_xfer import XFER_TYPES
from .sizes import format_size

SCENARIO_KEYS = ("mode", "pattern", "cache", "threads", "io_size")


def scenario_key(r: dict[str, Any]) -> tuple:
    return tuple(r[k] for k in SCENARIO_KEYS)


def scenario_text(s: dict[str, Any]) -> str:
    """'read sequential warm 8x16M' / 'read batch cold 1024x64K' ('all': each thread's share at once)."""
    size = "all" if s.get("io_label") == "all" else format_size(s["io_size"])
    count = s.get("batch") if s["pattern"] == "batch" else s["threads"]
    return f"{s['mode']} {s['pattern']} {s['cache']} {count}x{size}"


def summarize(records: list[dict[str, Any]], disk: dict[str, dict[str, Any]], batch: int) -> list[dict[str, Any]]:
    """One entry per (scenario, type): GB/s median, min and max over the repeats, median latency,
    residency before and after (lowest and highest), and the share of the disk's O_DIRECT limit
    for cold reads and for writes."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(*scenario_key(r), r["xfer"])].append(r)
    out = []
    for runs in groups.values():
        r0 = runs[0]
        rates = [r["gbps"] for r in runs]
        lats = [r["avg_latency_us"] for r in runs if r["avg_latency_us"] is not None]
        s = {k: r0[k] for k in (*SCENARIO_KEYS, "io_label", "xfer", "xfer_type", "threads_used")}
        if r0["pattern"] == "batch":
            s["batch"] = batch
        s.update(repeats=len(runs), median_gbps=statistics.median(rates), min_gbps=min(rates), max_gbps=max(rates),
                 median_latency_us=statistics.median(lats) if lats else None,
                 resident_before=[min(r["resident_before"] for r in runs), max(r["resident_before"] for r in runs)],
                 resident_after=[min(r["resident_after"] for r in runs), max(r["resident_after"] for r in runs)],
                 cache_as_asked=all(r["cache_as_asked"] for r in runs))
        limit = (disk.get(r0["mode"]) or {}).get("limit_gbps")
        s["vs_disk"] = s["median_gbps"] / limit if limit and (r0["cache"] == "cold" or r0["mode"] == "write") else None
        out.append(s)
    order = list(XFER_TYPES)
    out.sort(key=lambda s: (s["mode"] != "read", s["pattern"] == "batch", s["pattern"], s["threads"], s["io_size"],
                            s["cache"] != "warm", order.index(s["xfer"])))
    return out


def ratios(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """cmt's median over each other type's, scenario by scenario."""
    by_scenario: dict[tuple, dict[str, dict[str, Any]]] = defaultdict(dict)
    for s in summaries:
        by_scenario[scenario_key(s)][s["xfer"]] = s
    out = []
    for key, types in by_scenario.items():
        cmt = types.get("cmt")
        if cmt is None:
            continue
        for name, other in types.items():
            if name != "cmt":
                out.append({**dict(zip(SCENARIO_KEYS, key, strict=True)), "other": name,
                            "other_xfer_type": other["xfer_type"], "cmt_gbps": cmt["median_gbps"],
                            "other_gbps": other["median_gbps"],
                            "cmt_over_other": cmt["median_gbps"] / other["median_gbps"]})
    return out


def document(bench, plan, tf, skipped: dict[str, str], machine: dict[str, Any], engine: dict[str, Any] | None,
             quick: bool) -> dict[str, Any]:
    """The JSON result file's content (format `cmt-bench-io`, version 1)."""
    summaries = summarize(bench.records, bench.disk, plan.batch)
    types = {}
    for name, t in XFER_TYPES.items():
        if name in plan.xfers:
            types[name] = ({"status": "skipped", "reason": skipped[name]} if name in skipped else
                           {"status": "ran", **bench.details.get(name, {})})
            types[name]["about"] = t.about
    return {
        "format": "cmt-bench-io", "version": 1, "date": machine.get("date"), "machine": machine, "cmt": engine,
        "plan": plan.to_json(), "quick": quick,
        "file": {"path": str(tf.path), "size": tf.size, "filesystem": tf.filesystem, "removed_at_end": tf.remove},
        "xfer_types": types, "disk": bench.disk,
        "timing": ("host clock from the threads' common start to the last I/O's end; writes include a final "
                   "fdatasync. GB/s = 1e9 bytes/s; gdsio lines use GiB/s. Latency: each I/O's own time; in the "
                   "batch, each I/O's completion since the batch was submitted"),
        "statistics": ("summaries: median, min and max over the repeats (the types taken in turn within each "
                       "repeat); vs_disk: median over the disk's O_DIRECT limit (best median over stream counts); "
                       "ratios: cmt's median over the other type's, same scenario"),
        "failures": bench.failures, "summaries": summaries, "ratios": ratios(summaries), "runs": bench.records,
    }


# -- terminal -----------------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _residency(s: dict[str, Any]) -> str:
    """'0->100' (percent of the file in the page cache before -> after), ranges where repeats differ."""
    def span(lo: float, hi: float) -> str:
        return f"{100 * lo:.0f}" if round(100 * lo) == round(100 * hi) else f"{100 * lo:.0f}-{100 * hi:.0f}"

    text = f"{span(*s['resident_before'])}->{span(*s['resident_after'])}"
    return text if s["cache_as_asked"] else f"[yellow]{text}[/]"


def type_text(s: dict[str, Any]) -> str:
    """Our name, and the path KvikIO chose."""
    kind = s["xfer_type"]
    return f"{s['xfer']} {kind.split('_', 1)[1].lower() if kind.startswith('KVIKIO_') else ''}".strip()


_PATTERN_TITLES = {"sequential": "sequential", "random": "random blocks", "batch": "a batch of random reads at once"}


def tables(doc: dict[str, Any]) -> list:
    """One table per mode and pattern: a row per scenario and type."""
    from rich.table import Table

    from .report import _short

    cmt_by = {(*(r[k] for k in SCENARIO_KEYS), r["other"]): r["cmt_over_other"] for r in doc["ratios"]}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for s in doc["summaries"]:
        groups[(s["mode"], s["pattern"])].append(s)
    out = []
    for (mode, pattern), rows in groups.items():
        t = Table(title=f"{mode}, {_PATTERN_TITLES[pattern]}: GB/s, median [dim]min-max[/] over repeats",
                  title_justify="left", caption_justify="left")
        for col in ("scenario", "type", "GB/s", "lat us", "cached %", "vs disk", "cmt/type"):
            t.add_column(col, justify="left" if col in ("scenario", "type") else "right", no_wrap=True)
        last = None
        for s in rows:
            key = scenario_key(s)
            if last is not None and key != last:
                t.add_section()
            ratio = cmt_by.get((*key, s["xfer"]))
            lat = s["median_latency_us"]
            t.add_row(scenario_text(s).split(" ", 2)[2] if key != last else "", type_text(s),
                      f"{s['median_gbps']:.2f} [dim]{_short(s['min_gbps'])}-{_short(s['max_gbps'])}[/]",
                      "-" if lat is None else f"{lat:.0f}", _residency(s), _pct(s["vs_disk"]),
                      "-" if ratio is None else f"{ratio:.2f}x")
            last = key
        out.append(t)
    notes = [f"skipped {name}: {info['reason']}" for name, info in doc["xfer_types"].items()
             if info["status"] == "skipped"]
    notes += [f"failed {f['xfer']} ({f['mode']} {f['pattern']}): {f['error']}" for f in doc["failures"]]
    notes.append("cached %: the file's share in the page cache before->after each run (yellow: not the state asked); "
                 "lat us: each I/O's average (batch: its completion since the submit)")
    if out:
        out[-1].caption = "\n".join(notes)
    disk = list(doc["disk"].values())
    if disk:
        d_t = Table(title=f"the disk's own limit: O_DIRECT, {format_size(disk[0]['block'])} requests, GB/s median "
                    "[dim]min-max[/]", title_justify="left")
        for col in ("mode", "streams", "GB/s", "note"):
            d_t.add_column(col, no_wrap=col != "note")
        for d in disk:
            if not d["available"]:
                d_t.add_row(d["mode"], "-", "-", f"[yellow]{d['reason']}[/]")
            for r in d["runs"]:
                d_t.add_row(d["mode"], str(r["streams"]),
                            f"{r['median_gbps']:.2f} [dim]{_short(r['min_gbps'])}-{_short(r['max_gbps'])}[/]",
                            "limit" if r["streams"] == d["limit_streams"] else "")
        out.append(d_t)
    return out


# -- the plot -----------------------------------------------------------------------------------------
_COLORS = {"cpu": "0.6", "cpu-gpu": "tab:red", "cpu-pinned-gpu": "tab:orange", "cmt": "tab:blue",
           "kvikio": "tab:green", "cufile": "tab:purple"}


def plot(doc: dict[str, Any], path: Path) -> Path:
    """One panel per mode and pattern: grouped bars per scenario (median, min-max whiskers), the
    disk's O_DIRECT limit as a dashed line. Raises plotting.Unavailable without matplotlib."""
    from .. import plotting
    from .report import _save, machine_text

    plt = plotting.pyplot()
    panels: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for s in doc["summaries"]:
        panels[(s["mode"], s["pattern"])].append(s)
    n = max(1, len(panels))
    fig, axes = plt.subplots(1, n, figsize=(max(6.0, 5.5 * n), 4.8), squeeze=False)
    fig.suptitle(f"cmt bench io: {machine_text(doc.get('machine', {}))}, {format_size(doc['file']['size'])} "
                 f"file on {doc['file']['filesystem']}")
    if not panels:
        axes[0][0].text(0.5, 0.5, "nothing ran", ha="center", va="center", transform=axes[0][0].transAxes)
    for ax, ((mode, pattern), rows) in zip(axes[0], panels.items(), strict=False):
        scenarios = list(dict.fromkeys(scenario_text(s) for s in rows))
        names = [x for x in XFER_TYPES if any(s["xfer"] == x for s in rows)]
        width = 0.8 / max(1, len(names))
        for j, name in enumerate(names):
            mine = {scenario_text(s): s for s in rows if s["xfer"] == name}
            xs = [i + (j - (len(names) - 1) / 2) * width for i, sc in enumerate(scenarios) if sc in mine]
            got = [mine[sc] for sc in scenarios if sc in mine]
            med = [s["median_gbps"] for s in got]
            err = [[m - s["min_gbps"] for m, s in zip(med, got, strict=True)],
                   [s["max_gbps"] - m for m, s in zip(med, got, strict=True)]]
            ax.bar(xs, med, width, yerr=err, capsize=2, color=_COLORS.get(name), label=got[0]["xfer_type"].lower())
        limit = (doc["disk"].get(mode) or {}).get("limit_gbps")
        if limit:
            ax.axhline(limit, color="black", linestyle="--", linewidth=1, label=f"disk O_DIRECT {limit:.2f}")
        ax.set_xticks(range(len(scenarios)), [sc.split(" ", 2)[2] for sc in scenarios], rotation=20, ha="right")
        ax.set_title(f"{mode}, {pattern}")
        ax.set_ylabel("GB/s (median over repeats)")
        ax.set_ylim(bottom=0)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize="x-small")
    fig.tight_layout()
    return _save(plt, fig, path)
