"""The Keras callback that writes crash-safe checkpoints through a `CheckpointManager`."""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import keras

from kerasdist import compat
from kerasdist.checkpoint.background import BackgroundWriter
from kerasdist.checkpoint.callback_state import (
    CallbackStates,
    has_state,
    pack,
    running_metrics,
    set_running_metrics,
    unpack,
)
from kerasdist.checkpoint.manager import CheckpointManager, as_manager
from kerasdist.checkpoint.model_state import optimizer_step, plain
from kerasdist.checkpoint.record import CheckpointInfo, CheckpointWarning, Progress, RunRecord
from kerasdist.checkpoint.run_log import RunLog, run_log_for
from kerasdist.checkpoint.snapshot import SaveMemory, take_snapshot
from kerasdist.preemption import PreemptedExit, SigtermHold
from kerasdist.validation import boolean, choice, integer, optional_integer, optional_seconds


def checkpoint_callback(
    checkpoint_dir: str | os.PathLike[str],
    *,
    every_epoch: bool = True,
    every_steps: int | None = None,
    keep: int = 3,
    keep_best: bool = False,
    monitor: str = "loss",
    mode: str = "min",
    handle_sigterm: bool = True,
    async_save: bool = True,
    storage_options: Mapping[str, Any] | None = None,
    every_seconds: float | None = None,
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
        every_epoch: save at each epoch end.
        every_steps: also save every this many steps (None: only at epoch ends).
        keep: how many of the newest checkpoints to keep (>= 1).
        keep_best: also keep the checkpoint with the best `monitor` value.
        monitor: the epoch metric `keep_best` compares, e.g. "loss" or "val_loss".
        mode: "min" or "max": whether a smaller or larger `monitor` is better.
        handle_sigterm: save and exit on SIGTERM (preemption); default True.
        async_save: write checkpoints in a background thread (default True); False writes each
            one on the training thread before training goes on.
        storage_options: options for an object-store `checkpoint_dir` (credentials, endpoint).
        every_seconds: also save at the first step end this many seconds after the last save (or
            the start of fit): time-based saves ("every 10 minutes": `every_seconds=600`), resumed
            like step saves. The chief alone decides and writes, so workers never wait on it.
            `kerasdist.goodput()` suggests a value from a run's failures and save cost.
    """
    return CheckpointCallback(
        checkpoint_dir, every_epoch=every_epoch, every_steps=every_steps, keep=keep,
        keep_best=keep_best, monitor=monitor, mode=mode, handle_sigterm=handle_sigterm,
        async_save=async_save, storage_options=storage_options, every_seconds=every_seconds,
    )


def check_callback_args(every_epoch: Any, every_steps: Any, keep: Any, mode: Any, monitor: Any,
                        async_save: Any = True, every_seconds: Any = None) -> None:
    boolean("async_save", async_save)
    boolean("every_epoch", every_epoch)
    optional_integer("every_steps", every_steps, 1)
    optional_seconds("every_seconds", every_seconds)
    if not every_epoch and every_steps is None and every_seconds is None:
        raise ValueError("every_epoch is False and every_steps and every_seconds are None: the callback would "
                         "never save.")
    integer("keep", keep, 1, hint="the newest checkpoint is always kept")
    choice("mode", mode, ("min", "max"))
    if not isinstance(monitor, str) or not monitor:
        raise ValueError(f"monitor must be a metric name such as 'loss', got {monitor!r}.")


class CheckpointCallback(keras.callbacks.Callback):
    """See `checkpoint_callback`. `checkpoint_dir` may also be a `CheckpointManager`; `run`
    (trainers give it) is what each checkpoint records about the run: its training settings,
    global batch and epoch order."""

    def __init__(self, checkpoint_dir, *, every_epoch=True, every_steps=None, keep=3,
                 keep_best=False, monitor="loss", mode="min", handle_sigterm=True, async_save=True,
                 storage_options=None, run: RunRecord | None = None, every_seconds=None):
        super().__init__()
        check_callback_args(every_epoch, every_steps, keep, mode, monitor, async_save, every_seconds)
        self.manager: CheckpointManager = as_manager(checkpoint_dir, storage_options=storage_options)
        self.every_epoch = every_epoch
        self.every_steps = every_steps
        self.every_seconds = None if every_seconds is None else float(every_seconds)
        self._last_save_at = time.monotonic()
        self.keep = keep
        self.keep_best = keep_best
        self.monitor = monitor
        self.mode = mode
        self.handle_sigterm = handle_sigterm
        self.async_save = async_save
        self.saved: list[CheckpointInfo] = []
        self.blocked_seconds: list[float] = []  # per save: how long the training thread waited
        self._writer = BackgroundWriter()
        self._memory = SaveMemory()  # the background saves', reused from one to the next
        self._preempted = False
        self._step_offset = 0  # batches of the first epoch already trained before this fit
        self._first_epoch: int | None = None
        self._epoch = 0
        self._step = 0
        self._batch_begin: int | None = None  # the first step of the current call (execution)
        self._batches_seen = 0  # in this fit's current epoch
        self._saved_step: int | None = None  # the optimizer step of the last save
        self._history: list[dict[str, float]] = []
        self._best: CheckpointInfo | None = None
        self._sigterm: SigtermHold | None = None
        self._agreement: Any = None  # multi-worker: the workers' preemption agreement
        self._logs: dict | None = None
        self._is_chief = True
        self._one_worker = True
        self._task: str | None = None
        self._log: RunLog | None = None  # the chief's run log (run_log.py)
        self._first_step_logged = False
        self._eval_started: float | None = None
        # where the run's figures go as TensorBoard scalars (trainers set it when given a TensorBoard)
        self.tensorboard_dir: str | None = None
        self._epoch_started = (0.0, 0)  # time, saves so far
        self.run = run if run is not None else RunRecord()
        self._states = CallbackStates()  # the other callbacks of the current fit that have state
        self._states_to_restore: tuple[str, dict[str, Any]] | None = None  # (from where, what)
        self._carried: tuple[int, bytes] | None = None  # (step, packed state) at the last fit's end
        self._continued = False  # this fit ends only for the trainer to start the next one at once
        # a trainer whose steps run asynchronously (ps_fit) sets this: finish the steps in flight
        self.settle: Any = None

    # -- what trainers ask and tell --------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Path | str:
        return self.manager.directory

    def use_run(self, run: RunRecord) -> None:
        """Record `run` in the checkpoints from now on (resume_fit tells a callback the user made
        what its data is; settings the callback was given are kept unless `run` has some)."""
        self.run = run if run.settings or not self.run.settings else RunRecord(
            self.run.settings, run.global_batch_size, run.epoch_order)

    @property
    def preempted(self) -> bool:
        """SIGTERM was caught: the callback saves at the next batch end and stops training."""
        return self._preempted

    def wants_settled_state(self) -> bool:
        """Whether the next batch end saves a checkpoint on preemption, so a trainer that runs
        steps asynchronously (`ps_fit`) must let the steps in flight finish first."""
        return self._preempted

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

    # -- Keras hooks ------------------------------------------------------------------------
    def wait(self) -> None:
        """Wait for the background save in flight, if any; raise `BackgroundSaveError` if it (or
        one before it) failed."""
        self._writer.wait()

    def on_train_begin(self, logs=None):
        from kerasdist.context import context_of
        from kerasdist.preemption.agreement import agreement_for

        self.wait()  # a save a fit that raised left behind
        self._writer.restart_clock()
        self._last_save_at = time.monotonic()

        context = context_of(self.model.distribute_strategy)
        self._is_chief, self._task = context.is_chief, context.task
        self._one_worker = context.num_workers == 1 and not context.is_parameter_server
        start = self.manager.resume_point(self.model)
        self._history = list(start.history) if start is not None else []
        self._best = self.manager.best(self._better) if self.keep_best else None
        self._first_epoch = None
        self._find_other_callbacks()
        if self._is_chief:
            self.manager.remove_temporary()
            self._open_log(context)
        agreement = agreement_for(context.strategy) if self.handle_sigterm else None
        self._agreement = agreement.serve(self) if agreement is not None else None
        self._install_sigterm_handler()

    def on_epoch_begin(self, epoch, logs=None):
        first = self._first_epoch is None
        self._first_epoch = epoch if first else self._first_epoch
        if self._states_to_restore is not None:  # every callback's on_train_begin has reset it by now
            where, saved = self._states_to_restore
            self._states_to_restore = None
            if self._states or saved.get("callbacks"):
                self._states.restore(saved.get("callbacks", {}), where)
            if self._step_offset and saved.get("running_metrics") is not None:
                set_running_metrics(self.model, saved["running_metrics"])  # Keras reset them just now
        self._epoch = epoch
        self._step = self._step_offset if first else 0
        self._batches_seen = 0
        self._epoch_started = (time.perf_counter(), len(self.blocked_seconds))

    def on_train_batch_begin(self, batch, logs=None):
        self._batch_begin = batch

    def on_train_batch_end(self, batch, logs=None):
        # With steps_per_execution > 1 Keras calls the batch hooks once per execution, with its
        # first and last step; an epoch's last execution may hold fewer steps than it says.
        steps = self.params.get("steps")
        last = batch if steps is None else min(batch, steps - 1)
        begin = last if self._batch_begin is None else min(self._batch_begin, last)
        self._batch_begin = None
        self._step += last - begin + 1
        self._batches_seen = last + 1
        if self._log is not None:
            self._log.steps_ended(last - begin + 1)  # on disk now: exact after a SIGKILL
        if self._log is not None and not self._first_step_logged:
            self._first_step_logged = True
            self._log.event("first_step", step=optimizer_step(self.model))
        if self._agreement is not None:
            self._logs = logs
            self._agreement.check()  # on the agreed step: save_agreed_step, stop_preempted
            if self._preempted:
                return
        elif self._preempted:
            if self.settle is not None:  # SIGTERM came after the trainer looked (another callback's hook)
                self.settle()
            self._save(self._epoch, self._step, logs)
            self.model.stop_training = True
            return
        if self._last_batch():
            return  # the epoch end saves
        if (self.every_steps and optimizer_step(self.model) % self.every_steps == 0) or (
                self.every_seconds is not None and time.monotonic() - self._last_save_at >= self.every_seconds):
            self._save(self._epoch, self._step, logs)

    def save_agreed_step(self) -> None:
        """Multi-worker preemption, on every worker at the step all agreed on: the chief saves it
        (at an epoch's last batch, on_epoch_end saves the epoch instead)."""
        if not self._last_batch():
            self._save(self._epoch, self._step, self._logs, final=True)

    def stop_preempted(self) -> None:
        """Multi-worker preemption, after the agreed step's save: stop fit, then exit with 75."""
        self._preempted = True
        self.model.stop_training = True

    def _batches_left(self) -> int | None:
        """Batches of this fit's current epoch not trained yet; None when the epoch's length is unknown."""
        steps = self.params.get("steps")
        return None if steps is None else steps - self._batches_seen

    def _last_batch(self) -> bool:
        left = self._batches_left()
        return left is not None and left <= 0

    def on_epoch_end(self, epoch, logs=None):
        if self._preempted and not self._last_batch():
            return  # stopped mid-epoch: the step checkpoint is the resume point
        if self.model.stop_training and (self._batches_left() or 0) > 0:
            # Another callback stopped fit mid-epoch: a restart goes on at the next batch, not at
            # the next epoch (so this epoch is not in the history yet either).
            if self._saved_step != optimizer_step(self.model):
                self._save(self._epoch, self._step, logs)
            return
        self._history.append(plain(logs or {}))
        if self.every_epoch or self._preempted:
            self._save(epoch + 1, 0, logs)
        if self._log is not None and self.tensorboard_dir is not None:
            self._write_run_figures(epoch)
        if self._continued and not self.model.stop_training:
            self._carried = (optimizer_step(self.model), pack({"callbacks": self._states.states()}))
            self._states.before_continued_end()

    def on_test_begin(self, logs=None):
        self._eval_started = time.perf_counter()

    def on_test_end(self, logs=None):
        if self._log is not None and self._eval_started is not None:
            self._log.event("eval", seconds=round(time.perf_counter() - self._eval_started, 4))
        self._eval_started = None

    def on_train_end(self, logs=None):
        step = optimizer_step(self.model)
        if self._carried is None or self._carried[0] != step:
            self._carried = (step, pack({"callbacks": self._states.states()}))
        self._end_fit()  # under the SIGTERM handler: a preemption now waits for the write, then exits 75
        if self._preempted:
            saved = self.saved[-1] if self.saved else None  # the preemption's save, on the chief
            raise PreemptedExit(saved.path if saved else None,
                                saved.global_step if saved else optimizer_step(self.model))

    def stopped_by_lost_peer(self) -> None:
        """A peer of the cluster was lost mid-fit (`fit` raised, so Keras calls no end hook): the
        save in flight is finished, and the run log ends this fit as "peer lost"."""
        self._end_fit("peer lost")

    # -- helpers ----------------------------------------------------------------------------
    def _find_other_callbacks(self) -> None:
        """The callbacks of this fit that have state (`callback_state.py`), and the state they
        resume with: this callback's from the end of its last fit when the model has not trained
        since (a trainer's next fit), else the checkpoint of the model's step, if any (on the
        chief, or as the chief's restore sent it to the others)."""
        callback_list = compat.calling_callback_list()
        others = [c for c in (callback_list.callbacks if callback_list is not None else [])
                  if c is not self and not isinstance(c, CheckpointCallback)]
        self._states = CallbackStates(others)
        self._states.check()
        _warn_if_after(others, callback_list.callbacks.index(self) if callback_list is not None else 0)
        self._states_to_restore = None
        step = optimizer_step(self.model)
        if self._carried is not None and self._carried[0] == step:
            self._states_to_restore = ("the previous fit", unpack(self._carried[1]))
        elif step > 0:
            found = self.manager.callback_state(self.model, read=self._is_chief)
            if found is not None:
                self._states_to_restore = (found[0].path, unpack(found[1]) if found[1] is not None else {})
        self._carried = None

    def _fit_state(self, mid_epoch: bool) -> bytes | None:
        """What a checkpoint keeps of this fit besides the model: the other callbacks' state
        (what they wrote made durable first) and, mid-epoch, the epoch's running means."""
        self._states.flush()
        state: dict[str, Any] = {"callbacks": self._states.states()} if self._states else {}
        if mid_epoch and self._one_worker:  # a worker's metrics are its own: the chief's would not do for the others
            state["running_metrics"] = running_metrics(self.model)
        return pack(state) if state else None

    def _end_fit(self, status: str | None = None) -> None:
        """Wait for the save in flight, give back the memory and SIGTERM, end the run log's fit."""
        ended = False
        try:
            self.wait()
            ended = True
        finally:
            self._memory.release()  # nothing is written any more
            self._restore_sigterm_handler()
            self._close_log(ended, status)

    def _open_log(self, context: Any) -> None:
        """The chief's run log: the restores since the last fit, then this fit's start."""
        self._log = run_log_for(self.manager.store, context)
        for finished, seconds, info in self.manager.restores:  # the store's one manager (manager_for)
            self._log.event("restored", at=finished, seconds=round(seconds, 4),
                            checkpoint=self.manager.store.entry_of(info.path) if info else None,
                            step=info.global_step if info else 0)
        self.manager.restores.clear()
        self._first_step_logged = False
        self._log.event("train_begin", step=optimizer_step(self.model))
        model = self.model
        self._log.follow_steps(lambda: optimizer_step(model))

    def _write_run_figures(self, epoch: int) -> None:
        """Step time, blocked save time and goodput so far, as TensorBoard scalars (chief only)."""
        from kerasdist.goodput import goodput
        from kerasdist.monitoring import write_run_figures

        started, saves_before = self._epoch_started
        figures = {"step_seconds": (time.perf_counter() - started) / max(self._batches_seen, 1),
                   "save_blocked_seconds": sum(self.blocked_seconds[saves_before:])}
        try:
            figures["goodput"] = goodput(self.manager.store).goodput
        except Exception:  # noqa: BLE001 - a log unreadable (torn, foreign): the other figures still go
            pass
        write_run_figures(self.tensorboard_dir, epoch, figures)

    def _close_log(self, ended: bool, status: str | None = None) -> None:
        """The end of training in the run log; a fit whose last save failed (`ended` False) did
        not end: its attempt reads as crashed, by its exit event."""
        if self._log is not None:
            self._log.stop_following()
            if ended:
                status = status or ("preempted" if self._preempted else "completed")
                self._log.event("train_end", step=optimizer_step(self.model), status=status)
            self._log = None

    def _save(self, epoch: int, step: int, logs: dict | None, final: bool = False) -> None:
        """Save on the chief: in the background; on the training thread (after the save in
        flight) when `async_save` is off, when preempted or when `final` (the process exits next).
        The time the training thread spends here goes into `blocked_seconds`."""
        if not self._is_chief:
            return
        started = time.perf_counter()
        self._last_save_at = time.monotonic()
        self._saved_step = optimizer_step(self.model)
        state = self._fit_state(mid_epoch=step > 0)
        progress = Progress.of(epoch, step, self._history, logs, self._task, self.run, callbacks=state)
        try:
            if self.async_save and not (final or self._preempted):
                self._save_in_background(progress)
            else:
                self.wait()
                self._saved(*_timed(lambda: self.manager.save(self.model, progress)))
        finally:
            self.blocked_seconds.append(time.perf_counter() - started)
            if self._log is not None:
                self._log.event("save", step=optimizer_step(self.model), blocked=round(self.blocked_seconds[-1], 4))

    def _save_in_background(self, progress: Progress) -> None:
        self.wait()  # at most one in flight; its error is raised here
        self.manager.create()  # an unwritable directory fails here, on the training thread
        taken = take_snapshot(self.model, self._memory)
        self._writer.submit(
            lambda: self._saved(*_timed(lambda: self.manager.commit(taken, progress))),
            f"checkpoint ckpt-{taken.global_step} in {self.manager.directory}",
        )

    def _saved(self, info: CheckpointInfo, seconds: float) -> None:
        """After a checkpoint is committed (in the writer's thread for background saves, having
        taken `seconds`): note it, then prune."""
        log = self._log
        if log is not None:
            log.event("committed", step=info.global_step, checkpoint=self.manager.store.entry_of(info.path),
                      write=round(seconds, 4), bytes=info.size)
        self.saved.append(info)
        if self.keep_best and info.step_in_epoch == 0 and self._better(info, self._best):
            self._best = info
        self.manager.prune(self.keep, protect=(self._best, info))

    def _better(self, info: CheckpointInfo, best: CheckpointInfo | None) -> bool:
        value = info.metrics.get(self.monitor)
        if value is None:
            return False
        if best is None or best.metrics.get(self.monitor) is None:
            return True
        return value < best.metrics[self.monitor] if self.mode == "min" else value > best.metrics[self.monitor]

    def _install_sigterm_handler(self) -> None:
        self._preempted = False
        if not self.handle_sigterm:
            return
        handler = self._agreement.sigterm_handler if self._agreement is not None else self._on_sigterm
        self._sigterm = SigtermHold(handler)  # off the main thread it holds nothing: the caller's then

    def _restore_sigterm_handler(self) -> None:
        if self._sigterm is not None:
            self._sigterm.release()
            self._sigterm = None

    def _on_sigterm(self, signum, frame) -> None:
        self._preempted = True


def _warn_if_after(others: list[Any], position: int) -> None:
    """Callbacks with state after the checkpoint callback (`position` in the fit's list) run
    their epoch end after its save, so an epoch-end checkpoint would keep their state from before
    that epoch."""
    late = [type(c).__name__ for c in others[position:] if has_state(c)]
    if late:
        warnings.warn(
            f"callbacks {', '.join(late)} come after the kerasdist checkpoint callback: a checkpoint at an "
            "epoch's end would keep their state from before that epoch. Put checkpoint_callback(...) last.",
            CheckpointWarning, stacklevel=4,
        )


def _timed(call: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    return call(), time.perf_counter() - started


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
