"""`cmt tune`: finds the engine settings per direction and copy size for this machine and writes
them as a tuned file (cmt.config) that `cmt run` then picks up by the machine's fingerprint.

search (the full search, by measurement), model (the instant search, by a pipeline model), measure
(real copies, through cmt.bench.copy_sweep), machine (which machine this is, without CUDA), cli and
config_cli (the commands). Nothing heavy is imported here: `cmt run` imports cmt.tune.machine.
"""
