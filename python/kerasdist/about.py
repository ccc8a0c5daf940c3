"""`kerasdist_info()`: versions and the strategy "auto" picks here, with the reason."""

from __future__ import annotations

import platform

VERSION = "0.1.0"  # the one definition: the package (its __version__), its wheel (pyproject.toml) and the CLI read it


def kerasdist_info(kind: str = "auto") -> str:
    """Versions of the stack and a description of the strategy `select_strategy(kind)` gives."""
    import keras
    import numpy
    import tensorflow as tf

    from kerasdist.strategy import describe_strategy, select_strategy

    header = (
        f"kerasdist {VERSION} | TensorFlow {tf.__version__} | Keras {keras.__version__}"
        f" | NumPy {numpy.__version__} | Python {platform.python_version()}"
    )
    return f"{header}\n{describe_strategy(select_strategy(kind))}"
