"""cmt (cudamemcpy-tuner): pageable host<->GPU copies at the PCIe link's speed, in unmodified programs."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("cudamemcpy-tuner")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"
