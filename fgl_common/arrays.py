"""Index arithmetic every package shares (plain numpy)."""
from __future__ import annotations

import numpy as np


def offsets(counts) -> np.ndarray:
    """int64 [k+1]: where each of k consecutive pieces of ``counts`` items starts, then the
    total (``[0, c0, c0+c1, ...]``): CSR indptr from row lengths, client offsets from sizes."""
    counts = np.asarray(counts)
    out = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out
