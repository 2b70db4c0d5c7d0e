"""`cmt tune`: finds the engine settings per direction and copy size for this machine and writes
them as a tuned file (cmt.config) that `cmt run` then picks up by the machine's fingerprint.

search (the full search, by measurement), model (the instant search, by a pipeline model), measure
(real copies, through cmt.bench.copy_sweep), cli and config_cli (the commands). Which machine this
is, and the name of its tuned file, comes from cmt.machine.
"""
