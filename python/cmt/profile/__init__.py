"""`cmt profile`: every host<->device copy of a program, recorded by the preloaded library and
reported by direction, host memory kind and size, with a trace and the estimated saving."""
