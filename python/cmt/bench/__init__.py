"""`cmt bench`: copy-bandwidth sweeps (copy_sweep) and real workloads (workload_runner), with the
machine fingerprint (fingerprint) and the tables, JSON and plots (report). `cmt tune` reuses
copy_sweep's measurement functions and fingerprint's hardware id.

Nothing heavy is imported here: `cmt run` loads the command line, and with it this package."""

DIRECTIONS = ("h2d", "d2h", "d2h-fresh")
COPY_MODES = ("pageable", "pinned", "cmt")
MODES = (*COPY_MODES, "cpu")
