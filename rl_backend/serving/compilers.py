"""Which compilers build the embedded engine's kernels, in the order tried: the engine (decode_kernels.py) builds
with them and `agl doctor` names them, without importing torch."""

from __future__ import annotations

import os


def kernel_compilers() -> list[tuple[str, str]]:
    """(language, compiler command): C++ (`$CXX`, else c++) builds every kernel as torch operators; C (`$CC`, else
    cc) builds the attention alone, called through Python on one thread."""
    cxx = os.environ.get("CXX", "").strip() or "c++"
    cc = os.environ.get("CC", "").strip() or "cc"
    return [("C++", cxx), ("C", cc)]
