"""`cmt bench`: copy-bandwidth sweeps (copy_sweep), real workloads (workload_runner) and copies on a
loaded machine (load; its child processes in load_children and load_probe, its JSON, tables and plot
in load_report), with the tables, JSON and plots (report);
the machine fingerprint comes from cmt.machine. `cmt tune` reuses copy_sweep's measurement functions.

Nothing heavy is imported here: `cmt bench --help` loads this package."""

DIRECTIONS = ("h2d", "d2h", "d2h-fresh")
COPY_MODES = ("pageable", "pinned", "cmt")
MODES = (*COPY_MODES, "cpu")
