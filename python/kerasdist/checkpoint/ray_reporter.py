"""The checkpoint callback's part under Ray Train (`ray_train.py` says what Ray sees of a run):
each epoch's metrics from every worker, the chief's newest commit as a Ray checkpoint of the
committed directory itself, and the checkpoints Ray holds spared from pruning
(`Saver.held_elsewhere`). Outside a Ray Train training function there is no such part."""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kerasdist.checkpoint.model_state import plain
from kerasdist.checkpoint.record import CheckpointInfo, CheckpointWarning
from kerasdist.ray_train import STORAGE_SCHEMES, ray_train_module, storage_url

_COMMIT_POLL_SECONDS = 0.2  # how often Ray's upload thread looks whether a failed save ended


def ray_reporter(saver: Any) -> RayReporter | None:
    """The checkpoint callback's Ray part for `saver`, following its commits and sparing what Ray
    holds from its pruning; None outside a Ray Train training function."""
    train = ray_train_module()
    if train is None:
        return None
    reporter = RayReporter(train, saver)
    recorded = saver.on_committed

    def committed(info: CheckpointInfo, seconds: float) -> None:
        if recorded is not None:
            recorded(info, seconds)
        reporter.committed(info)

    saver.on_committed = committed
    saver.held_elsewhere = reporter.held
    return reporter


class RayReporter:
    """Reports a kerasdist run to Ray Train (see `ray_train.py`'s docstring).

    Ray's rule is that every worker calls `ray.train.report` the same number of times (it is a
    barrier); kerasdist's time-based saves are the chief's own decision, so reports happen at
    epoch ends, which every worker shares. A checkpoint committed mid-epoch is on disk and
    resumable; Ray is told of the newest one at the next epoch end. The report is asynchronous:
    the epoch end's own checkpoint, still being written in the background, is waited for in Ray's
    upload thread while training goes on.

    Checkpoints Ray was given are Ray's to delete (its `CheckpointConfig(num_to_keep)`), since a
    new driver of the run refuses to start when one it lists is gone: kerasdist's pruning (`keep`)
    spares them and applies to the others.
    """

    def __init__(self, train: Any, saver: Any):
        self._train = train
        self._saver = saver
        self._storage = train.get_context().get_storage()
        self._root = self._fs_path(saver.manager.directory)  # None: not in the run's storage
        self._changed = threading.Condition()
        self._unreported: CheckpointInfo | None = None  # the newest commit Ray was not told of
        self._awaited: _Claim | None = None  # a report's checkpoint, the save in flight's commit
        self._held: dict[str, CheckpointInfo] = {}  # the checkpoints this process reported, by path
        # what earlier worker groups of the run reported (the chief asks Ray before its first report)
        self._reported_before = self._paths_reported_before() if self._is_rank_zero() else set()
        self._earlier: list[CheckpointInfo] | None = None  # those checkpoints, read at first need
        self._warned = False

    # -- the saver's side (the writer's thread, or the training thread) -----------------------
    def committed(self, info: CheckpointInfo) -> None:
        with self._changed:
            if self._awaited is not None:  # an epoch end's report waits for this commit
                self._awaited.info, self._awaited = info, None
                self._held[info.path] = info
            else:
                self._unreported = info
            self._changed.notify_all()

    def held(self) -> list[CheckpointInfo]:
        """The checkpoints pruning must spare: those Ray was given, by this worker group or an
        earlier one of the run."""
        with self._changed:
            if self._earlier is None:
                self._earlier = [info for info in self._saver.manager.checkpoints()
                                 if self._fs_path(info.path) in self._reported_before] if self._reported_before else []
            return [*self._earlier, *self._held.values()]

    # -- the training thread, every worker -----------------------------------------------------
    def epoch_ended(self, epoch: int, logs: dict[str, Any] | None, is_chief: bool) -> None:
        """Report epoch `epoch`'s (0-based) metrics, on the chief with its newest checkpoint."""
        train = self._train
        options: dict[str, Any] = {"checkpoint_upload_mode": train.CheckpointUploadMode.ASYNC,
                                   "delete_local_checkpoint_after_upload": False}
        newest = self._claim_newest() if is_chief else None
        if newest is not None:
            options["checkpoint"] = train.Checkpoint(self._root, filesystem=self._storage.storage_filesystem)
            options["checkpoint_upload_fn"] = lambda _checkpoint, _name: self._ray_checkpoint(newest())
        train.report({**plain(logs or {}), "epoch": epoch + 1}, **options)

    # -- helpers -------------------------------------------------------------------------------
    def _claim_newest(self) -> Callable[[], CheckpointInfo] | None:
        """What the chief's report carries: a function giving the newest checkpoint committed since
        the last report (waiting for the save in flight, if any), or None when there is none."""
        if self._root is None:
            self._warn_outside_storage()
            return None
        with self._changed:
            busy = self._saver.busy  # a save in flight: the newest, once it commits
            claim = _Claim(None if busy else self._unreported)
            self._unreported = None
            if claim.info is not None:
                self._held[claim.info.path] = claim.info
            elif busy:
                self._awaited = claim
            else:
                return None
            return lambda: self._committed_for(claim)

    def _committed_for(self, claim: _Claim) -> CheckpointInfo:
        """In Ray's upload thread: the claim's checkpoint, once the save in flight has committed it."""
        with self._changed:
            while claim.info is None:
                if not self._saver.busy and claim.info is None:
                    self._awaited = None
                    raise RuntimeError(
                        "kerasdist's checkpoint save in flight at the epoch end ended without a commit "
                        "(its error is raised in training as BackgroundSaveError); nothing to report to Ray."
                    )
                self._changed.wait(_COMMIT_POLL_SECONDS)
            return claim.info

    def _ray_checkpoint(self, info: CheckpointInfo) -> Any:
        return self._train.Checkpoint(self._fs_path(info.path), filesystem=self._storage.storage_filesystem)

    def _is_rank_zero(self) -> bool:
        return self._train.get_context().get_world_rank() == 0

    def _paths_reported_before(self) -> set[str]:
        if self._root is None:
            return set()
        reported = self._train.get_all_reported_checkpoints(
            consistency_mode=self._train.CheckpointConsistencyMode.COMMITTED)
        return {r.checkpoint.path for r in reported if r.checkpoint is not None}

    def _fs_path(self, location: Any) -> str | None:
        """`location` (a checkpoint directory or URL of kerasdist's) as a path on Ray's storage
        filesystem, or None when it is not inside the run's directory there."""
        filesystem, experiment = self._storage.storage_filesystem, self._storage.experiment_fs_path
        scheme = STORAGE_SCHEMES.get(filesystem.type_name)
        location = os.fspath(location)
        if scheme is None:
            return None
        if scheme:
            if not location.startswith(scheme):
                return None
            path, root = location[len(scheme):].rstrip("/"), experiment.rstrip("/")
        else:
            if "://" in location:
                return None
            path, root = os.path.realpath(location), os.path.realpath(experiment)
        return path if path == root or path.startswith(root + "/") else None

    def _warn_outside_storage(self) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"checkpoint_dir {str(self._saver.manager.directory)!r} is outside this Ray Train run's "
                f"storage ({storage_url(self._storage.storage_filesystem, self._storage.experiment_fs_path)}): Ray "
                "gets each epoch's metrics but no checkpoint (it would have to copy them). Use "
                "checkpoint_dir=kerasdist.ray_checkpoint_dir() to make kerasdist's checkpoints Ray's.",
                CheckpointWarning, stacklevel=3)


@dataclass
class _Claim:
    """The checkpoint one report carries: known when claimed, or set when the save in flight commits."""

    info: CheckpointInfo | None
