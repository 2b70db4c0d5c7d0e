"""`cmt bench`: copy-bandwidth sweeps (copy_sweep) and real workloads (workload_runner), with the
machine fingerprint (fingerprint) and the tables, JSON and plots (report). `cmt tune` reuses
copy_sweep's measurement functions and fingerprint's hardware id."""
