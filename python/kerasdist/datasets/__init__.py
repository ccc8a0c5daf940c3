"""Small real data sets shipped inside kerasdist, so demos and tests never download anything.

`load_digits()`: the UCI ML optical recognition of handwritten digits data (test set), 1,797
8x8 images of the digits 0-9 by E. Alpaydin and C. Kaynak, Bogazici University (1998), from the
UCI Machine Learning Repository, https://doi.org/10.24432/C50P49, licensed CC BY 4.0. The file
`digits.csv.gz` is the copy scikit-learn ships; see README.md in this directory.
"""

from __future__ import annotations

import gzip
from importlib import resources

import numpy as np

DIGITS_FILE = "digits.csv.gz"
DIGITS_SAMPLES = 1797


def load_digits(*, flatten: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The UCI handwritten digits: 1,797 8x8 grey images of 0-9, bundled (no download).

    Data: E. Alpaydin and C. Kaynak, "Optical Recognition of Handwritten Digits", UCI Machine
    Learning Repository (1998), https://doi.org/10.24432/C50P49, CC BY 4.0. Each pixel counts the
    "on" pixels of a 4x4 block of a 32x32 bitmap (0..16); here it is divided by 16.

    Args:
        flatten: return x as (1797, 64) rows instead of (1797, 8, 8, 1) images.

    Returns:
        `(x, y)`: x float32 in [0, 1], shape (1797, 8, 8, 1) (channels last, for Conv2D) or
        (1797, 64) with `flatten=True`; y int32 labels 0-9, shape (1797,). The rows are in the
        file's order (not sorted by label), so the last rows make a fair held-out set.
    """
    if not isinstance(flatten, bool):
        raise ValueError(f"flatten must be True or False, got {flatten!r}.")
    source = resources.files(__name__).joinpath(DIGITS_FILE)
    with source.open("rb") as raw, gzip.open(raw, "rt") as text:
        table = np.loadtxt(text, delimiter=",", dtype=np.int32)
    if table.shape != (DIGITS_SAMPLES, 65):
        raise RuntimeError(f"{DIGITS_FILE} is damaged: expected 1797 rows of 65 values, got {table.shape}.")
    x = (table[:, :64].astype(np.float32) / np.float32(16.0))
    y = table[:, 64].astype(np.int32)
    return (x if flatten else x.reshape(-1, 8, 8, 1)), y


__all__ = ["load_digits"]
