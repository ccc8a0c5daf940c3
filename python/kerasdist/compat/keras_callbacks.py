"""Keras's callbacks: the `CallbackList` a callback's hook is called from, which a checkpoint
callback needs to find the callbacks beside it in a `fit` it did not build (Keras offers no
public way; gated on the Keras versions checked, canary in tests/python/test_callback_state.py)."""

from __future__ import annotations

import sys
from typing import Any

import keras

from kerasdist.compat.versions import version_within

# Keras releases whose CallbackList calls each callback's hook from a method of its own, the list
# being that method's `self` (3.15.1 checked): how a checkpoint callback finds the callbacks beside
# it in a `fit` it did not build (a canary in test_callback_state.py).
CALLBACK_LIST_VERSIONS = ((3, 0), (3, 16))


def calling_callback_list(depth: int = 6) -> Any:
    """The `keras.callbacks.CallbackList` whose hook is running the caller's hook, or None (a hook
    called directly, or a Keras outside `CALLBACK_LIST_VERSIONS`)."""
    if not version_within(keras.__version__, CALLBACK_LIST_VERSIONS):
        return None
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, keras.callbacks.CallbackList):
            return owner
        frame = frame.f_back
    return None
