"""kerasdist under Ray Train: what Ray sees of a run, and where its checkpoints live.

Inside a training function that Ray Train runs (`ray.train.tensorflow.TensorflowTrainer`, which
writes each worker's TF_CONFIG), the checkpoint callback has one more part,
`checkpoint.ray_reporter.RayReporter`, which finds Ray's context here (`ray_train_module`): at each
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

import sys
from typing import Any

CHECKPOINT_FOLDER = "kerasdist"  # ray_checkpoint_dir's folder in the run's storage
# pyarrow's filesystem type names and the URL scheme kerasdist's stores use for them
STORAGE_SCHEMES = {"local": "", "s3": "s3://", "gcs": "gs://"}


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
    return storage_url(storage.storage_filesystem, f"{storage.experiment_fs_path.rstrip('/')}/{folder}")


def storage_url(filesystem: Any, path: str) -> str:
    """`path` on a Ray storage `filesystem` (pyarrow) as kerasdist's stores name it."""
    scheme = STORAGE_SCHEMES.get(filesystem.type_name)
    if scheme is None:
        raise ValueError(
            f"Ray's storage filesystem {filesystem.type_name!r} is not one kerasdist writes checkpoints to "
            "(a local or shared directory, s3:// or gs://)."
        )
    return f"{scheme}{path}"
