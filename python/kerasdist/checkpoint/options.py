"""The checkpoint options: one typed record, its one check and one docstring per field.

`CheckpointOptions` says when checkpoints are written, how, which are kept, what SIGTERM does and
when a fit that stopped stepping counts as hung.
`checkpoint_callback`, `CheckpointCallback`, `distributed_fit` and `custom_fit` take its fields
as keyword arguments, each written out in their signature with the record's default
(`keep: int = CheckpointOptions.keep`), their docs taken from here (`validation.with_field_docs`);
they build the record once (`validation.record_from`, which checks it) and pass it on.

A new checkpoint option is a field here (its default, its entry under `Args`, its check in
`__post_init__`), the keyword in the four functions above (and their R twins;
tests/python/test_signatures.py names any that lacks it), and its use in the part of the callback
that acts on it (`save_policy`, `saver`, `preemption_hold`, `watchdog`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kerasdist.validation import (
    boolean,
    choice,
    integer,
    optional_integer,
    optional_seconds,
    seconds_or_auto,
)


@dataclass(frozen=True)
class CheckpointOptions:
    """When checkpoints are written, how, which are kept, what SIGTERM does, and when a fit hangs.

    Args:
        every_epoch: save at each epoch end.
        every_steps: also save every this many steps (batches, also under gradient accumulation);
            None: only at epoch ends.
        every_seconds: also save at the first step end this many seconds after the last save (or
            the start of fit): time-based saves ("every 10 minutes": `every_seconds=600`), resumed
            like step saves. The chief alone decides and writes, so workers never wait on it.
            `kerasdist.goodput()` suggests a value from a run's failures and save cost.
        keep: how many of the newest checkpoints to keep (>= 1; the newest valid one is never
            deleted).
        keep_best: also keep the checkpoint with the best `monitor` value.
        monitor: the epoch metric `keep_best` compares, e.g. "loss" or "val_loss".
        mode: "min" or "max": whether a smaller or larger `monitor` is better.
        async_save: write checkpoints in a background thread (default True), so training waits
            only while the model's state is copied; False writes each one on the training thread
            before training goes on.
        storage_options: options for an object-store checkpoint directory (credentials,
            endpoint), checked by the store.
        handle_sigterm: on SIGTERM (preemption), save at the next step end and exit with status
            75; default True.
        hang_timeout: the step watchdog: after this many seconds without a training step (a
            callback, a data loader or a peer stuck), every thread's stack goes to stderr, the
            run log records the hang and the process exits with status 77 (`HUNG_EXIT_CODE`), for
            the launcher or scheduler to restart it. "auto" (default): ten times the slowest step
            of the fit so far, at least 120 s; None: no watchdog. The time before a fit's first
            step, saves and validation passes are not counted.
    """

    every_epoch: bool = True
    every_steps: int | None = None
    every_seconds: float | None = None
    keep: int = 3
    keep_best: bool = False
    monitor: str = "loss"
    mode: str = "min"
    async_save: bool = True
    storage_options: Mapping[str, Any] | None = None
    handle_sigterm: bool = True
    hang_timeout: float | str | None = "auto"

    def __post_init__(self) -> None:
        """The one check of the options (plain Python numbers kept)."""
        boolean("async_save", self.async_save)
        boolean("every_epoch", self.every_epoch)
        object.__setattr__(self, "every_steps", optional_integer("every_steps", self.every_steps, 1))
        object.__setattr__(self, "every_seconds", optional_seconds("every_seconds", self.every_seconds))
        if not self.every_epoch and self.every_steps is None and self.every_seconds is None:
            raise ValueError("every_epoch is False and every_steps and every_seconds are None: the callback "
                             "would never save.")
        object.__setattr__(self, "keep", integer("keep", self.keep, 1, hint="the newest checkpoint is always kept"))
        boolean("keep_best", self.keep_best)
        choice("mode", self.mode, ("min", "max"))
        if not isinstance(self.monitor, str) or not self.monitor:
            raise ValueError(f"monitor must be a metric name such as 'loss', got {self.monitor!r}.")
        boolean("handle_sigterm", self.handle_sigterm)
        object.__setattr__(self, "hang_timeout", seconds_or_auto("hang_timeout", self.hang_timeout))


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(CheckpointOptions))
