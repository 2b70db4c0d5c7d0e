"""Copy sizes as people write them: '4K', '1M', '1.5G', '4096'; lists '4K,1M,64M'; ranges '4K:1G'."""

from __future__ import annotations

import re

from ..errors import CmtError

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
MAX_SIZE = 64 << 30  # larger copies are not a benchmark any more: they need 4x as much memory


def parse_size(text: str) -> int:
    """'64K' -> 65536 (binary units; 'KiB', 'KB' and 'K' mean the same)."""
    m = _SIZE.match(text)
    if not m:
        raise CmtError(f"{text!r} is not a size (examples: 4096, 64K, 1M, 1G)")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value != int(value) or value < 1:
        raise CmtError(f"{text!r} is not a whole, positive number of bytes")
    if value > MAX_SIZE:
        raise CmtError(f"{text!r} is larger than the largest size the benchmark copies ({format_size(MAX_SIZE)})")
    return int(value)


def parse_sizes(text: str) -> list[int]:
    """'4K,1M,64M' (a list) or '4K:1G' (powers of two from 4K to 1G), sorted, without repeats."""
    if not text or not text.strip():
        raise CmtError("the size list is empty (examples: --sizes 4K,1M,64M or --sizes 4K:1G)")
    sizes: set[int] = set()
    for item in text.split(","):
        if ":" in item:
            lo_text, _, hi_text = item.partition(":")
            lo, hi = parse_size(lo_text), parse_size(hi_text)
            if lo > hi:
                raise CmtError(f"size range {item.strip()!r} runs backwards ({format_size(lo)} > {format_size(hi)})")
            n = lo
            while n <= hi:
                sizes.add(n)
                n *= 2
        else:
            sizes.add(parse_size(item))
    return sorted(sizes)


def format_size(n: int) -> str:
    """65536 -> '64K'; sizes that are not a whole number of a unit keep the smaller unit."""
    for unit in ("T", "G", "M", "K"):
        if n >= _UNITS[unit] and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


def parse_names(text: str, known: tuple[str, ...], what: str) -> list[str]:
    """A comma-separated choice from `known`, in the order given, e.g. --directions h2d,d2h."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise CmtError(f"no {what} given (choose from {', '.join(known)})")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise CmtError(f"unknown {what} {', '.join(map(repr, unknown))} (choose from {', '.join(known)})")
    return list(dict.fromkeys(names))
