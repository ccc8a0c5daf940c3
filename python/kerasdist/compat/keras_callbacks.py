"""Keras's callbacks: the `CallbackList` a callback's hook is called from, which a checkpoint
callback needs to find the callbacks beside it in a `fit` it did not build (Keras offers no
public way; gated on the Keras versions checked, canary in tests/python/test_callback_state.py);
and the private attributes in which ModelCheckpoint and TensorBoard keep what a resumed run needs
(`MODEL_CHECKPOINT_COUNTERS`, `TENSORBOARD_COUNTERS`, `tensorboard_writers`; the same canaries)."""

from __future__ import annotations

import sys
from typing import Any

import keras

from kerasdist.compat.versions import version_within

# Keras releases whose CallbackList calls each callback's hook from a method of its own, the list
# being that method's `self` (3.15.1 checked): how a checkpoint callback finds the callbacks beside
# it in a `fit` it did not build (a canary in test_callback_state.py).
CALLBACK_LIST_VERSIONS = ((3, 0), (3, 16))


# ModelCheckpoint's count of the batches since it last saved (save_freq=N) and TensorBoard's step
# counters: private attributes that on_train_begin resets (Keras 3.15.1 checked).
MODEL_CHECKPOINT_COUNTERS = ("_batches_seen_since_last_saving", "_last_batch_seen")
TENSORBOARD_COUNTERS = ("_global_train_batch", "_global_test_batch")


def tensorboard_writers(callback: keras.callbacks.TensorBoard) -> list[Any]:
    """The summary writers a TensorBoard callback opened (train, validation)."""
    return list(getattr(callback, "_writers", {}).values())


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
