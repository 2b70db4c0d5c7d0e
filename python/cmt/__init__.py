"""cmt (cudamemcpy-tuner): pageable host<->GPU copies at the PCIe link's speed, in unmodified programs."""


def __getattr__(name: str) -> str:
    # The version on first use: importlib.metadata takes 5-18 ms to import, which `import cmt.io`
    # inside a timed model load would pay.
    if name != "__version__":
        raise AttributeError(f"module 'cmt' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("cudamemcpy-tuner")
    except PackageNotFoundError:  # running from a source tree
        v = "0.0.0"
    globals()["__version__"] = v
    return v
