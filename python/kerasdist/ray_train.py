"""kerasdist under Ray Train: what Ray sees of a run, and where its checkpoints live.

Inside a training function that Ray Train runs (`ray.train.tensorflow.TensorflowTrainer`, which
writes each worker's TF_CONFIG), the checkpoint callback has one more part, `RayReporter`: at each
epoch end every worker reports the epoch's metrics to Ray, and the chief's report carries the
newest checkpoint kerasdist committed since the last report, as a Ray checkpoint of the committed
directory itself (no copy). `ray_checkpoint_dir()` names the directory in the run's Ray storage
(`RunConfig(storage_path, name)`, local or `s3://` / `gs://`) that makes kerasdist's checkpoints
Ray's: a restarted worker group, a new driver with the same `RunConfig` and Ray Tune then find them.

Nothing here imports Ray. Ray's context is looked for only in a process that has imported
`ray.train` already (a Ray Train worker has, before it runs the training function), so
`import kerasdist` and every run outside Ray are unchanged. Ray Train V2 (Ray 2.60's default) is
what it reports to; under V1 (`RAY_TRAIN_V2_ENABLED=0`, deprecated) nothing is reported.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kerasdist.checkpoint.model_state import plain
from kerasdist.checkpoint.record import CheckpointInfo, CheckpointWarning

CHECKPOINT_FOLDER = "kerasdist"  # ray_checkpoint_dir's folder in the run's storage
# pyarrow's filesystem type names and the URL scheme kerasdist's stores use for them
_SCHEMES = {"local": "", "s3": "s3://", "gcs": "gs://"}
_COMMIT_POLL_SECONDS = 0.2  # how often Ray's upload thread looks whether a failed save ended


def ray_train_module() -> Any | None:
    """The `ray.train` module when this process runs a Ray Train (V2) training function, else
    None (never imports Ray)."""
    train = sys.modules.get("ray.train")
    if train is None or not hasattr(train, "CheckpointUploadMode"):  # not imported, or V1
        return None
    try:
        train.get_context()
    except RuntimeError:  # the driver, or any other process that imported Ray
        return None
    return train


def ray_checkpoint_dir(folder: str = CHECKPOINT_FOLDER) -> str:
    """The checkpoint directory in this Ray Train run's storage: `<storage_path>/<name>/<folder>`.

    Call it inside the training function that a Ray `TensorflowTrainer` runs and give it to
    `distributed_fit` (or `make_or_restore_model` and `resume_fit`) as `checkpoint_dir`. Each
    epoch's newest checkpoint is then reported to Ray as the committed directory itself (nothing
    copied), so `result.checkpoint`, Ray Tune and a new driver with the same
    `RunConfig(name, storage_path)` see it; a worker group Ray restarts resumes from there.
    `storage_path` must be a directory every node reaches (shared disk), or `s3://` / `gs://`.

    ```python
    def train_fn(config):
        kerasdist.distributed_fit(build_model, x, y, epochs=10,
                                  checkpoint_dir=kerasdist.ray_checkpoint_dir())
    ```

    Args:
        folder: the folder's name inside the run's directory (default "kerasdist").

    Returns:
        A local path, or an `s3://` / `gs://` URL.

    Raises:
        RuntimeError: outside a Ray Train (V2) training function.
        ValueError: a `folder` that is not a plain name, or a Ray storage filesystem kerasdist
            cannot write to (neither local, S3 nor GCS).
    """
    if not isinstance(folder, str) or not folder or folder in (".", "..") or "/" in folder:
        raise ValueError(f"folder must be a plain folder name, got {folder!r}.")
    train = ray_train_module()
    if train is None:
        raise RuntimeError(
            "ray_checkpoint_dir() names a directory in a Ray Train run's storage: call it inside the "
            "training function a Ray TensorflowTrainer runs (Ray Train V2, Ray's default)."
        )
    storage = train.get_context().get_storage()
    return _url(storage.storage_filesystem, f"{storage.experiment_fs_path.rstrip('/')}/{folder}")


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
    """Reports a kerasdist run to Ray Train (see the module docstring).

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
        scheme = _SCHEMES.get(filesystem.type_name)
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
                f"storage ({_url(self._storage.storage_filesystem, self._storage.experiment_fs_path)}): Ray "
                "gets each epoch's metrics but no checkpoint (it would have to copy them). Use "
                "checkpoint_dir=kerasdist.ray_checkpoint_dir() to make kerasdist's checkpoints Ray's.",
                CheckpointWarning, stacklevel=3)


@dataclass
class _Claim:
    """The checkpoint one report carries: known when claimed, or set when the save in flight commits."""

    info: CheckpointInfo | None


def _url(filesystem: Any, path: str) -> str:
    """`path` on a Ray storage `filesystem` (pyarrow) as kerasdist's stores name it."""
    scheme = _SCHEMES.get(filesystem.type_name)
    if scheme is None:
        raise ValueError(
            f"Ray's storage filesystem {filesystem.type_name!r} is not one kerasdist writes checkpoints to "
            "(a local or shared directory, s3:// or gs://)."
        )
    return f"{scheme}{path}"
