"""The Keras callback that writes crash-safe checkpoints through a `CheckpointManager`.

It is made of parts, each in its module: `SavePolicy` (when to save, which checkpoints to keep),
`Saver` (how: on the training thread or in the background, then pruned), `PreemptionHold`
(SIGTERM held during fit), `RunRecorder` (the chief's run log and the run's figures),
`StepWatchdog` (a fit that stops stepping ends with 77), all set by one `CheckpointOptions`;
`StepTimes` (every worker's step times, for naming a straggler), `OtherCallbacks` (the fit's
other callbacks and their state) and, inside a Ray Train training function,
`ray_reporter.RayReporter` (what Ray sees of the run). The callback follows the fit (epoch, step,
history) and tells each part what happened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import keras

from kerasdist.checkpoint.manager import CheckpointManager, as_manager, manager_of
from kerasdist.checkpoint.model_state import optimizer_step, plain
from kerasdist.checkpoint.options import OPTION_NAMES, CheckpointOptions
from kerasdist.checkpoint.other_callbacks import OtherCallbacks
from kerasdist.checkpoint.peers import Peers
from kerasdist.checkpoint.preemption_hold import PreemptionHold
from kerasdist.checkpoint.ray_reporter import ray_reporter
from kerasdist.checkpoint.record import CheckpointInfo, Progress, RunRecord
from kerasdist.checkpoint.recorder import RunRecorder
from kerasdist.checkpoint.run_log import Status
from kerasdist.checkpoint.save_policy import SavePolicy
from kerasdist.checkpoint.saver import Saver
from kerasdist.checkpoint.step_times import StepTimes
from kerasdist.checkpoint.watchdog import StepWatchdog
from kerasdist.preemption import PreemptedExit
from kerasdist.validation import record_from, with_field_docs


@with_field_docs(CheckpointOptions)
def checkpoint_callback(
    checkpoint_dir: str | os.PathLike[str],
    *,
    options: CheckpointOptions | None = None,
    every_epoch: bool = CheckpointOptions.every_epoch,
    every_steps: int | None = CheckpointOptions.every_steps,
    every_seconds: float | None = CheckpointOptions.every_seconds,
    keep: int = CheckpointOptions.keep,
    keep_best: bool = CheckpointOptions.keep_best,
    monitor: str = CheckpointOptions.monitor,
    mode: str = CheckpointOptions.mode,
    async_save: bool = CheckpointOptions.async_save,
    storage_options: Mapping[str, Any] | None = CheckpointOptions.storage_options,
    handle_sigterm: bool = CheckpointOptions.handle_sigterm,
    hang_timeout: float | str | None = CheckpointOptions.hang_timeout,
) -> CheckpointCallback:
    """A Keras callback that writes crash-safe checkpoints.

    Saves at the end of every epoch (`every_epoch`) and/or every `every_steps` steps (batches)
    and/or at the first step end `every_seconds` after the last save, atomically; keeps the
    `keep` newest (plus the best by `monitor` when `keep_best`), never deleting the newest valid
    one. Under multi-worker strategies only the chief writes. On SIGTERM
    it saves at the next step boundary, stops training and raises `PreemptedExit` (exit status
    `PREEMPTED_EXIT_CODE`, 75), which names the checkpoint saved. Under a multi-worker strategy a
    SIGTERM to any worker stops every worker after one agreed step (`preemption/agreement.py`):
    the chief saves that step and every worker exits with 75.

    With `async_save` (the default) training waits for a save only while the model's state is
    copied (`checkpoint/snapshot.py`); the files are written and committed in a background thread
    (`checkpoint/background.py`), one save at a time, with the same atomic commit. The next save,
    a preemption save and the end of `fit` wait for it; an error in it is raised there
    (`BackgroundSaveError`); a crash during it leaves the checkpoints saved before.
    `blocked_seconds` lists, per save, how long the training thread waited.

    Every checkpoint also keeps the state of the other callbacks of the `fit` (EarlyStopping's
    patience and best, ReduceLROnPlateau's, ModelCheckpoint's best, TensorBoard's step counters,
    CSVLogger's rows, and any callback with `get_state()` / `set_state(state)`: see
    `checkpoint/callback_state.py`); a resumed run gives it back before its first batch. Put
    this callback last in `callbacks`, so an epoch-end checkpoint holds their state after that
    epoch (kerasdist's trainers do).

    Args:
        checkpoint_dir: where checkpoints go, created if missing: a directory, or an object-store
            URL (`s3://bucket/run`, `gs://bucket/run`; see `CheckpointManager`).
        options: a `CheckpointOptions` to start from (default: every option's default); a
            keyword below that is not at its default replaces its field.

    The other arguments are the checkpoint options, the fields of `CheckpointOptions`, each
    documented there.
    """
    return CheckpointCallback(checkpoint_dir, record_from(CheckpointOptions, locals(), options))


class CheckpointCallback(keras.callbacks.Callback):
    """See `checkpoint_callback`. `checkpoint_dir` may also be a `CheckpointManager`; `run`
    (trainers give it) is what each checkpoint records about the run: its training settings,
    global batch and epoch order. The options' fields read as attributes too (`callback.keep`)."""

    @with_field_docs(CheckpointOptions)
    def __init__(
        self,
        checkpoint_dir: Any,
        options: CheckpointOptions | None = None,
        *,
        run: RunRecord | None = None,
        every_epoch: bool = CheckpointOptions.every_epoch,
        every_steps: int | None = CheckpointOptions.every_steps,
        every_seconds: float | None = CheckpointOptions.every_seconds,
        keep: int = CheckpointOptions.keep,
        keep_best: bool = CheckpointOptions.keep_best,
        monitor: str = CheckpointOptions.monitor,
        mode: str = CheckpointOptions.mode,
        async_save: bool = CheckpointOptions.async_save,
        storage_options: Mapping[str, Any] | None = CheckpointOptions.storage_options,
        handle_sigterm: bool = CheckpointOptions.handle_sigterm,
        hang_timeout: float | str | None = CheckpointOptions.hang_timeout,
    ):
        """The callback's parts, set by one `CheckpointOptions`.

        Args:
            checkpoint_dir: a directory, an object-store URL or a `CheckpointManager`.
            options: a `CheckpointOptions` to start from; a keyword below that is not at its
                default replaces its field.
            run: what each checkpoint records about the run (default: nothing known).

        The other arguments are the checkpoint options, the fields of `CheckpointOptions`.
        """
        super().__init__()
        self.options = record_from(CheckpointOptions, locals(), options)
        self.manager: CheckpointManager = as_manager(checkpoint_dir, storage_options=self.options.storage_options)
        self.policy = SavePolicy(self.options)
        self.saver = Saver(self.manager, self.policy)
        self.hold = PreemptionHold(self.options.handle_sigterm)
        self.recorder = RunRecorder()
        self.saver.on_committed = self.recorder.committed
        self.ray = ray_reporter(self.saver)  # under Ray Train: reports to Ray (None elsewhere)
        self.watchdog = StepWatchdog(self.options.hang_timeout)
        self.step_times = StepTimes()
        self._peers: tuple[Any, Peers | None] | None = None  # (the RunContext, its peers)
        self.run = run if run is not None else RunRecord()
        self.source: Any = None  # the data the trainer reads itself, whose position checkpoints keep
        # where the run's figures go as TensorBoard scalars (trainers set it when given a TensorBoard)
        self.tensorboard_dir: str | None = None
        # a trainer whose steps run asynchronously (ps_fit) sets this: finish the steps in flight
        self.settle: Any = None
        # where this fit stands
        self._step_offset = 0  # batches of the first epoch already trained before this fit
        self._first_epoch: int | None = None
        self._epoch = 0
        self._step = 0
        self._batch_begin: int | None = None  # the first step of the current call (execution)
        self._batches_seen = 0  # in this fit's current epoch
        self._epoch_steps = 0  # steps of this fit's current epoch
        self._saved_step: int | None = None  # the optimizer step of the last save
        self._history: list[dict[str, float]] = []
        self._run_history: list[dict[str, float]] | None = None  # a trainer's run: its history, handed down
        self._logs: dict | None = None  # the last batch end's (multi-worker: the agreed step saves them)
        self._is_chief = True
        self._unprepared = False
        self._one_worker = True
        self._task: str | None = None
        self.others = OtherCallbacks()  # the fit's other callbacks and their state
        self._continued = False  # this fit ends only for the trainer to start the next one at once

    def __getattr__(self, name: str) -> Any:
        """An option's value read as the callback's own attribute (`callback.keep`), as before the
        options were one record."""
        options = self.__dict__.get("options")
        if options is not None and name in OPTION_NAMES:
            return getattr(options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- what trainers ask and tell --------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Path | str:
        return self.manager.directory

    @property
    def saved(self) -> list[CheckpointInfo]:
        """The checkpoints this callback committed, oldest first."""
        return self.saver.saved

    @property
    def blocked_seconds(self) -> list[float]:
        """Per save, how long the training thread waited."""
        return self.saver.blocked_seconds

    def use_run(self, run: RunRecord) -> None:
        """Record `run` in the checkpoints from now on (resume_fit tells a callback the user made
        what its data is; settings the callback was given are kept unless `run` has some)."""
        kept = run.settings or not self.run.settings
        self.run = run if kept else dataclasses.replace(run, settings=self.run.settings)

    def begin_run(self, start: CheckpointInfo | None) -> None:
        """A trainer's run begins at `start` (its resume point; None: a fresh start): its fits go on
        from that checkpoint's history, which the callback then carries from one fit to the next."""
        self._run_history = list(start.history) if start is not None else []

    def end_run(self) -> None:
        """The trainer's run ended: a fit without a trainer (Keras's own) asks the store again."""
        self._run_history = None

    def use_input(self, source: Any) -> None:
        """Keep `source`'s position (a `data.resumable.ResumableInput`, which the trainer reads
        one batch per step) in every checkpoint from now on; None: no position."""
        self.source = source

    def wants_settled_state(self) -> bool:
        """Whether the next batch end saves a checkpoint on preemption, so a trainer that runs
        steps asynchronously (`ps_fit`) must let the steps in flight finish first."""
        return self.hold.preempted

    @contextlib.contextmanager
    def resuming_mid_epoch(self, steps_done: int, then_continues: bool = False) -> Iterator[None]:
        """For a fit that starts `steps_done` batches into its first epoch: checkpoints then
        record the step within the epoch, not within the fit. `then_continues`: the trainer
        starts another fit right after this one's epoch (unless a callback stops training), so
        the other callbacks' state goes on into it."""
        self._step_offset = int(steps_done)
        self._continued = then_continues
        try:
            yield
        finally:
            self._step_offset = 0
            self._continued = False

    def wait(self) -> None:
        """Wait for the background save in flight, if any; raise `BackgroundSaveError` if it (or
        one before it) failed."""
        self.saver.wait()

    # -- Keras hooks ------------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        from kerasdist.context import context_of

        self.saver.begin()  # a save a fit that raised left behind is waited for
        context = context_of(self.model.distribute_strategy)
        self._is_chief, self._task = context.is_chief, context.task
        self._one_worker = context.num_workers == 1 and not context.is_parameter_server
        self._history = self._run_history if self._run_history is not None else self._history_in_store()
        self.policy.begin(self.manager)
        self._first_epoch = None
        self.others.find(self, CheckpointCallback, self.model, self.manager, self._is_chief)
        self._unprepared = self._is_chief  # the saves' memory: after the first step, see there
        if self._is_chief:
            self.manager.remove_temporary()
            managers = {id(m): m for m in (self.manager, manager_of(self.model)) if m is not None}
            self.recorder.open(self.manager.store, context, managers.values(), self._global_step)
        self.hold.take(context.strategy, self)
        self._watch(context)

    def on_epoch_begin(self, epoch, logs=None):
        first = self._first_epoch is None
        self._first_epoch = epoch if first else self._first_epoch
        self.others.restore(self.model, mid_epoch=bool(self._step_offset))
        self._epoch = epoch
        self._step = self._step_offset if first else 0
        self._batches_seen = 0
        self._epoch_steps = 0
        self.recorder.epoch_began()
        self.step_times.epoch_began()
        self.watchdog.at_epoch_boundary()  # until the epoch's first step ends (its pipeline)

    def on_train_batch_begin(self, batch, logs=None):
        self._batch_begin = batch
        self.recorder.step_began()
        self.step_times.step_began()

    def on_train_batch_end(self, batch, logs=None):
        # With steps_per_execution > 1 Keras calls the batch hooks once per execution, with its
        # first and last step; an epoch's last execution may hold fewer steps than it says.
        steps = self.params.get("steps")
        last = batch if steps is None else min(batch, steps - 1)
        begin = last if self._batch_begin is None else min(self._batch_begin, last)
        self._batch_begin = None
        self._step += last - begin + 1
        self._epoch_steps += last - begin + 1
        self._batches_seen = last + 1
        self.watchdog.stepped(last - begin + 1)
        self.step_times.steps_ended(last - begin + 1)
        self.recorder.steps_ended(last - begin + 1, self._global_step)
        if self._unprepared:  # after the first step, when the optimizer has made its slots
            self._unprepared = False
            with self.watchdog.paused(for_peers=True):
                self.saver.prepare(self.model)
        if self.hold.agreement is not None:
            self._logs = logs
            self.hold.agreement.check()  # on the agreed step: save_agreed_step, stop_preempted
            if self.hold.preempted:
                return
        elif self.hold.preempted:
            if self.settle is not None:  # SIGTERM came after the trainer looked (another callback's hook)
                self.settle()
            self._save(self._epoch, self._step, logs)
            self.model.stop_training = True
            return
        if not self._last_batch() and self.policy.due_at_step(self._global_step):
            self._save(self._epoch, self._step, logs)
        if self._last_batch():
            self.watchdog.at_epoch_boundary()  # validation's setup and the epoch's end hooks follow

    def save_agreed_step(self) -> None:
        """Multi-worker preemption, on every worker at the step all agreed on: the chief saves it
        (at an epoch's last batch, on_epoch_end saves the epoch instead)."""
        if not self._last_batch():
            self._save(self._epoch, self._step, self._logs, final=True)

    def stop_preempted(self) -> None:
        """Multi-worker preemption, after the agreed step's save: stop fit, then exit with 75."""
        self.hold.preempted = True
        self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        self.watchdog.boundary_done()
        if self.hold.preempted and not self._last_batch():
            return  # stopped mid-epoch: the step checkpoint is the resume point
        if self.model.stop_training and (self._batches_left() or 0) > 0:
            # Another callback stopped fit mid-epoch: a restart goes on at the next batch, not at
            # the next epoch (so this epoch is not in the history yet either).
            if self._saved_step != optimizer_step(self.model):
                self._save(self._epoch, self._step, logs)
            return
        self._history.append(plain(logs or {}))
        if self.policy.due_at_epoch_end() or self.hold.preempted:
            self._save(epoch + 1, 0, logs)
        if self.ray is not None:
            self.ray.epoch_ended(epoch, logs, self._is_chief)
        self.step_times.epoch_ended(epoch, self._epoch_steps, self.recorder.epoch_blocked)
        if self.recorder.is_open and self.tensorboard_dir is not None:
            from kerasdist.monitoring import write_run_figures

            write_run_figures(self.tensorboard_dir, epoch, self.recorder.figures(self._batches_seen))
        if self._continued and not self.model.stop_training:
            self.others.carry_into_next_fit(self.model)

    def on_test_begin(self, logs=None):
        self.watchdog.boundary_done()
        self.watchdog.pause()  # every worker validates: nobody waits for this one
        self.recorder.eval_began()

    def on_test_end(self, logs=None):
        self.recorder.eval_ended()
        self.watchdog.resume()
        self.watchdog.at_epoch_boundary()  # the validation's teardown (its pipeline's threads end), the end hooks

    def on_train_end(self, logs=None):
        # the trainer's next fit follows at once: the watchdog goes on watching (`stop_watching` at its end)
        carry = self._continued and not self.model.stop_training and not self.hold.preempted
        self.stop_watching(carry)
        self.others.carry_at_fit_end(self.model)
        with self.watchdog.paused(for_peers=True):  # the write in flight: the other workers wait for it
            self._end_fit()  # under the SIGTERM hold: a preemption now waits for the write, then exits 75
        if carry:
            self.watchdog.at_epoch_boundary()  # until the next fit's first step
        if self.hold.preempted:
            saved = self.saved[-1] if self.saved else None  # the preemption's save, on the chief
            raise PreemptedExit(saved.path if saved else None,
                                saved.global_step if saved else optimizer_step(self.model))

    def stopped_by_lost_peer(self) -> None:
        """A peer of the cluster was lost mid-fit (`fit` raised, so Keras calls no end hook): the
        save in flight is finished, and the run log ends this fit as "peer lost"."""
        self.stop_watching()
        self._end_fit(Status.PEER_LOST)

    # -- helpers ----------------------------------------------------------------------------
    def _watch(self, context: Any) -> None:
        """Start the step watchdog and the step times for this fit (`watchdog`, `step_times`); the
        other workers are reached through one `Peers` while the fits run in the same cluster."""
        if self._peers is None or self._peers[0] is not context:
            self._peers = (context, Peers.of(context))
        peers = self._peers[1]
        self.watchdog.start(step=self._global_step(), task=context.task, is_chief=self._is_chief, peers=peers,
                            record=self.recorder.hung if self._is_chief else None,
                            stacks_fd=self.recorder.stacks_file() if self.watchdog.enabled else None)
        # a step compiled with XLA has no room for the step times' clock
        xla = bool(getattr(self.model, "jit_compile", False)) or bool(self.run.settings.get("jit_compile"))
        self.step_times.start(peers, xla, self.recorder.step_times if self._is_chief else None)

    def stop_watching(self, carry: bool = False) -> None:
        """No more step watchdog (the trainer's fits ended, or raised); `carry`: the trainer's next
        fit follows at once, so the watchdog goes on."""
        self.watchdog.stop(carry)
        self.step_times.stop()

    def _global_step(self) -> int:
        return optimizer_step(self.model)

    def _history_in_store(self) -> list[dict[str, float]]:
        """The history a fit no trainer runs (Keras's own) goes on from: its resume point's."""
        start = self.manager.resume_point(self.model)
        return list(start.history) if start is not None else []

    def _batches_left(self) -> int | None:
        """Batches of this fit's current epoch not trained yet; None when the epoch's length is unknown."""
        steps = self.params.get("steps")
        return None if steps is None else steps - self._batches_seen

    def _last_batch(self) -> bool:
        left = self._batches_left()
        return left is not None and left <= 0

    def _end_fit(self, status: Status | None = None) -> None:
        """Wait for the save in flight, give back the memory and SIGTERM, end the run log's fit."""
        ended = False
        try:
            self.saver.end()
            ended = True
        finally:
            self.hold.give_back()
            status = status or (Status.PREEMPTED if self.hold.preempted else Status.COMPLETED)
            self.recorder.close(ended, status, self._global_step)

    def _save(self, epoch: int, step: int, logs: dict | None, final: bool = False) -> None:
        """Save on the chief: in the background; on the training thread (after the save in
        flight) when `async_save` is off, when preempted or when `final` (the process exits next).
        The time the training thread spends here goes into `blocked_seconds`."""
        if not self._is_chief:
            return

        def progress() -> Progress:
            self.policy.saving()
            self._saved_step = optimizer_step(self.model)
            state = self.others.checkpointed(self.model, mid_epoch=step > 0, one_worker=self._one_worker)
            position = self.source.state() if self.source is not None else None
            return Progress.of(epoch, step, self._history, logs, self._task, self.run, callbacks=state,
                               input=position)

        in_background = self.options.async_save and not (final or self.hold.preempted)
        try:
            with self.watchdog.paused(for_peers=True):
                self.saver.save(self.model, progress, in_background)
        finally:
            self.recorder.saved(optimizer_step(self.model), self.blocked_seconds[-1])


def refuse_backup_and_restore(callback: Any, index: int) -> None:
    """Keras's BackupAndRestore would restore its own copy over the checkpoint kerasdist resumed."""
    if isinstance(callback, keras.callbacks.BackupAndRestore):
        raise ValueError(
            f"callbacks[{index}] is a Keras BackupAndRestore: kerasdist's checkpoints already back up and "
            "restore (on every worker, from the chief's); remove it."
        )


def check_trainer_callbacks(callbacks: Any, trainer: str) -> list[Any]:
    """The user's callbacks for `trainer` ("distributed_fit", "custom_fit"), which adds its own
    checkpoint callback: one callback or a list of Keras callbacks, none of them a kerasdist one."""
    if callbacks is None:
        return []
    if isinstance(callbacks, keras.callbacks.Callback):
        callbacks = [callbacks]
    if not isinstance(callbacks, (list, tuple)):
        raise ValueError(f"callbacks must be a list of Keras callbacks, got {type(callbacks).__name__}.")
    for index, callback in enumerate(callbacks):
        if isinstance(callback, CheckpointCallback):
            raise ValueError(
                f"callbacks[{index}] is a kerasdist checkpoint callback: {trainer} adds its own; set "
                "checkpoint_dir, every_steps and keep instead."
            )
        refuse_backup_and_restore(callback, index)
        if not isinstance(callback, keras.callbacks.Callback):
            raise ValueError(
                f"callbacks[{index}] must be a Keras callback (keras.callbacks.Callback), got "
                f"{type(callback).__name__}."
            )
    return list(callbacks)
