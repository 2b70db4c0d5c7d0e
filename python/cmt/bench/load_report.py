"""`cmt bench load`'s report: the JSON result document, the terminal tables and the plot."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .sizes import format_size

if TYPE_CHECKING:
    from .load import LoadPlan


def document(rows: list[dict[str, Any]], failures: list[str], machine: dict[str, Any], engine: dict[str, Any],
             plan: LoadPlan) -> dict[str, Any]:
    """The JSON result file's content (format `cmt-bench-load`, version 1)."""
    return {
        "format": "cmt-bench-load", "version": 1, "date": machine.get("date"), "machine": machine, "cmt": engine,
        "plan": plan.to_json(),
        "timing": ("busy: cmt bench copy's sweep in each process (pageable: host clock around the blocking copy "
                   "and a synchronisation; pinned: CUDA events); duplex, processes, threads: host clock from the "
                   "first copy's start to the last one's end (processes: the shared monotonic clock), pageable "
                   "and pinned alike, each copy an async copy on its own non-blocking stream and a synchronisation"),
        "statistics": ("each side: median, min and max over its processes (each process's figure is the median "
                       "over its repeats); pinned_*: the same processes' pinned copies; vs_pinned: median over "
                       "the processes of pageable / pinned within each; cmt_vs_plain: cmt median / plain median; "
                       "_pairs: cmt / plain per round (the processes ran in turn); processes under cmt: "
                       "lanes_most, the most copy threads the node budget's shared segment counted while they "
                       "copied (sampled every ms in each), against node_budget"),
        "failures": failures,
        "results": rows,
    }


# -- terminal tables ----------------------------------------------------------------------------------
def _gpus_text(gpus: list[int]) -> str:
    return f"GPU{'s' if len(gpus) > 1 else ''} {','.join(map(str, gpus))}"


def _share(side: dict[str, Any]) -> str:
    runs = [r for r in side.get("runs", []) if r.get("pageable", {}).get("share_min") is not None]
    if not runs:
        return "-"
    lo = statistics.median(r["pageable"]["share_min"] for r in runs)
    hi = statistics.median(r["pageable"]["share_max"] for r in runs)
    return f"{lo:.2f}-{hi:.2f}"


def _lanes(side: dict[str, Any]) -> str:
    """The most copy threads the node's segment counted in any run, against the node's budget."""
    runs = [r for r in side.get("runs", []) if r.get("lanes_most") is not None]
    if not runs:
        return "-"
    most = max(r["lanes_most"] for r in runs)
    budget = min(r["node_budget"] for r in runs)
    return f"{most}/{budget}" if most <= budget else f"[red]{most}/{budget}[/]"


def _pinned_cell(side: dict[str, Any]) -> dict[str, Any] | None:
    if not side.get("pinned_median_gbps"):
        return None
    return {"median_gbps": side["pinned_median_gbps"], "min_gbps": side["pinned_min_gbps"],
            "max_gbps": side["pinned_max_gbps"]}


def tables(doc: dict[str, Any]) -> list:
    from rich.table import Table

    from .report import _PASSED_NOTE, _cell, _ratio

    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for row in doc["results"]:
        by_scenario.setdefault(row["scenario"], []).append(row)
    out = []
    titles = {"busy": "busy host", "duplex": "both directions at once",
              "processes": "processes copying at once, host to device", "threads": "threads of one process at once"}
    for scenario, rows in by_scenario.items():
        first = {"busy": ("busy", "copy"), "duplex": ("copies",), "processes": ("GPU", "copies"),
                 "threads": ("GPU", "copies")}[scenario]
        t = Table(title=f"{titles[scenario]}: GB/s, median [dim]min-max[/] over processes", title_justify="left",
                  caption_justify="left")
        cols = (*first, "plain", "cmt", "pinned", "cmt/plain", "cmt/pin", *(
            ("shares",) if scenario in ("processes", "threads") else ()), *(
            ("lanes",) if scenario == "processes" else ()))
        for col in cols:
            t.add_column(col, justify="right", no_wrap=True, min_width=len(col) if len(col) <= 6 else None)
        for row in rows:
            plain, cmt = row["plain"], row["cmt"]
            plain_cell = _cell(plain) if plain.get("median_gbps") else "[red]failed[/]" if plain["errors"] else "-"
            cmt_cell = _cell(cmt) if cmt.get("median_gbps") else "[red]failed[/]" if cmt["errors"] else "-"
            vs_pinned = f"{100 * cmt['vs_pinned']:.0f}%" if cmt.get("vs_pinned") else "-"
            plain_r = plain if plain.get("median_gbps") else None
            cmt_r = cmt if cmt.get("median_gbps") else None
            if scenario == "busy":
                head = (str(row["busy_threads"]), f"{row['direction']} {format_size(row['bytes'])}")
            elif scenario == "duplex":
                head = (f"h2d + d2h {format_size(row['bytes'])}",)
            elif scenario == "processes":
                head = (",".join(map(str, row["gpus"])), f"{row['processes']}x {format_size(row['bytes'])}")
            else:
                head = (",".join(map(str, row["gpus"])),
                        f"{row['threads']}x {row['direction']} {format_size(row['bytes'])}")
            pinned = f"{cmt['pinned_median_gbps']:.1f}" if cmt.get("pinned_median_gbps") else "-"
            cells = [*head, plain_cell, cmt_cell, pinned, _ratio(cmt_r, plain_r), vs_pinned]
            if scenario in ("processes", "threads"):
                cells.append(_share(cmt))
            if scenario == "processes":
                cells.append(_lanes(cmt))
            t.add_row(*cells)
            if cmt.get("outcome"):
                t.caption = _PASSED_NOTE
        notes = {"busy": "busy: CPU-burning processes; pinned: the cmt processes' own (CUDA events)",
                 "duplex": "pinned: the cmt processes' own, both directions at once",
                 "processes": "shares: cmt, each process's rate against the mean of all (1 = fair); lanes: the "
                              "most copy threads the node's budget counted, against the budget",
                 "threads": "shares: cmt, each thread's rate against the mean of all (1 = fair)"}
        if scenario in notes:
            t.caption = "\n".join(x for x in (t.caption, notes[scenario]) if x)
        out.append(t)
    return out


# -- the plot -------------------------------------------------------------------------------------------
_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray")


def _bars(ax, labels: list[str], rows: list[dict[str, Any]]) -> None:
    width = 0.27
    xs = range(len(rows))
    for offset, (name, color, pick) in zip((-width, 0, width), (
            ("plain", "tab:red", lambda r: r["plain"]), ("cmt", "tab:blue", lambda r: r["cmt"]),
            ("pinned (cmt processes)", "0.5", lambda r: _pinned_cell(r["cmt"]) or {})), strict=True):
        med = [pick(r).get("median_gbps") or 0 for r in rows]
        lo = [m - (pick(r).get("min_gbps") or m) for m, r in zip(med, rows, strict=True)]
        hi = [(pick(r).get("max_gbps") or m) - m for m, r in zip(med, rows, strict=True)]
        ax.bar([x + offset for x in xs], med, width, yerr=[lo, hi], color=color, label=name, capsize=2)
    ax.set_xticks(list(xs), labels, rotation=20, ha="right")


def plot(doc: dict[str, Any], path: Path) -> Path:
    """One panel per scenario (the busy host: one per direction). Raises plotting.Unavailable
    without matplotlib."""
    from .. import plotting
    from .report import _save, machine_text

    plt = plotting.pyplot()
    rows = doc["results"]
    panels: list[tuple[str, list[dict[str, Any]]]] = []
    for scenario in doc["plan"]["scenarios"]:
        mine = [r for r in rows if r["scenario"] == scenario]
        if scenario == "busy":
            panels += [(f"busy:{d}", [r for r in mine if r["direction"] == d]) for d in doc["plan"]["directions"]]
        elif mine:
            panels.append((scenario, mine))
    cols = min(3, max(1, len(panels)))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6 * cols, 4.6 * nrows), squeeze=False)
    fig.suptitle(f"cmt bench load: {machine_text(doc.get('machine', {}))}")
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (name, mine) in zip(axes.flat, panels, strict=False):
        if name.startswith("busy:"):
            d = name.split(":")[1]
            for i, n in enumerate(sorted({r["bytes"] for r in mine})):
                pts = sorted((r["busy_threads"], r) for r in mine if r["bytes"] == n)
                xs = [b for b, _ in pts]
                color = _COLORS[i % len(_COLORS)]
                for side, style in (("cmt", "-"), ("plain", "--")):
                    ax.plot(xs, [r[side].get("median_gbps") or float("nan") for _, r in pts], style, marker="o",
                            color=color, label=f"{side} {format_size(n)}")
            ax.set_xlabel("CPU-burning processes")
            ax.set_xticks(sorted({r["busy_threads"] for r in mine}))
            ax.set_title(f"busy host: {'host to device' if d == 'h2d' else 'device to host'} "
                         "(solid cmt, dashed plain)")
            ax.legend(fontsize="x-small", ncol=2)
        elif name == "processes":
            for gpus in sorted({tuple(r["gpus"]) for r in mine}):
                pts = sorted((r["processes"], r) for r in mine if tuple(r["gpus"]) == gpus)
                xs = [n for n, _ in pts]
                style = "-" if len(gpus) == 1 else ":"
                for side, color, pick in (("plain", "tab:red", lambda r: r["plain"]),
                                          ("cmt", "tab:blue", lambda r: r["cmt"]),
                                          ("pinned", "0.4", lambda r: _pinned_cell(r["cmt"]) or {})):
                    ax.plot(xs, [pick(r).get("median_gbps") or float("nan") for _, r in pts], style, marker="o",
                            color=color, label=f"{side}, {_gpus_text(list(gpus))}")
            counts = sorted({r["processes"] for r in mine})
            ax.set_xscale("log", base=2)
            ax.set_xticks(counts, [str(n) for n in counts])
            ax.set_xlabel(f"processes, each {format_size(mine[0]['bytes'])} host to device")
            ax.set_title("processes at once: aggregate")
            ax.legend(fontsize="x-small")
        elif name == "duplex":
            _bars(ax, [f"h2d + d2h, {format_size(mine[0]['bytes'])} each"], mine)
            ax.set_title("both directions at once: total")
            ax.legend(fontsize="small")
        else:
            _bars(ax, [f"{r['direction']}, {_gpus_text(r['gpus'])}" for r in mine], mine)
            ax.set_title(f"{mine[0]['threads']} threads x {format_size(mine[0]['bytes'])}: aggregate")
            ax.legend(fontsize="small")
        ax.set_ylabel("GB/s (median over processes)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return _save(plt, fig, path)
