"""How the native library is built: one optimisation level, chosen on purpose."""

from __future__ import annotations

import re
from pathlib import Path

CMAKE = (Path(__file__).resolve().parent.parent / "CMakeLists.txt").read_text()


def test_one_optimisation_level():
    """-O2, the level every engine measurement was made with: CMake's Release flags are set to it, and
    no target option adds another level after them (which silently won before)."""
    assert re.search(r'set\(CMAKE_CXX_FLAGS_RELEASE "-O2 -DNDEBUG"\)', CMAKE)
    options = re.findall(r"target_compile_options\((.*?)\)\n", CMAKE, re.S)
    assert options and not any(re.search(r"-O[0-3s]", o) for o in options)
