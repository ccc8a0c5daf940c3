"""Workarounds for upstream bugs, each small, gated on the versions that need it, and tested.

Each one, why it is needed and the test that fails once upstream changes (so the shim can go) is
described in docs/upstream.md ("How each workaround works"). Here, in this order:
- Keras 3 `fit` under MultiWorkerMirroredStrategy (keras#20585, tensorflow#72388), an uneven
  global batch under a mirrored strategy, keras#23085's optimizer variables: applied at import,
  lifted for a block by `keras_as_released()`;
- a MultiWorkerMirroredStrategy made too late (`explain_late_multi_worker_strategy`);
- the coordination service's heartbeat timeout (`configure_coordination`);
- Keras saving's skip-set cache (`warm_saving_skipsets`);
- the preemption handler's GCE probe (`gce_metadata_probe_off`) and TensorFlow's
  SlurmClusterResolver on CPU-only nodes (`slurm_resolver`);
- tf.data's Grappler pass per iterator (`map_on_cpu`, `flat_map_on_cpu`);
- Keras's saving internals for background snapshots (`keras_snapshot_supported`,
  `keras_model_bytes`);
- the `CallbackList` a callback is called from (`calling_callback_list`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.tensorflow import optimizer as tf_optimizer
from keras.src.backend.tensorflow import trainer as tf_trainer
from keras.src.losses import loss as loss_module
from tensorflow.python.data.ops import dataset_ops, structured_function
from tensorflow.python.ops import gen_dataset_ops

# Keras releases whose multi-worker fit needs the patches (3.15.1 checked; 3.16 unknown yet).
MULTI_WORKER_FIX_VERSIONS = ((3, 0), (3, 16))

# Keras's TensorFlow trainer class: TensorFlowTrainer up to 3.15, Trainer in 3.16.0.dev (a rename
# that would otherwise break `import kerasdist` on the next Keras; make upstream-check found it).
TRAINER = getattr(tf_trainer, "TensorFlowTrainer", None) or tf_trainer.Trainer
_applied = False
_original_reduce_per_replica = tf_trainer.reduce_per_replica
_original_symbolic_build = TRAINER._maybe_symbolic_build


def keras_needs_multi_worker_fixes(version: str = keras.__version__) -> bool:
    """Whether this Keras version's multi-worker fit is known to need the patches."""
    return _version_within(version, MULTI_WORKER_FIX_VERSIONS)


def _version_within(version: str, bounds: tuple[tuple[int, int], tuple[int, int]]) -> bool:
    """Whether `version`'s (major, minor) lies in [low, high) of `bounds`."""
    major_minor = tuple(int(part) for part in version.split(".")[:2])
    low, high = bounds
    return low <= major_minor < high


def apply_multi_worker_fixes(force: bool = False) -> bool:
    """Patch Keras's multi-worker fit if this Keras needs it (or `force`); idempotent. Returns
    whether the patches are in place."""
    global _applied
    if _applied or not (force or keras_needs_multi_worker_fixes()):
        return _applied
    tf_trainer.reduce_per_replica = _reduce_per_replica
    TRAINER._maybe_symbolic_build = _maybe_symbolic_build
    _applied = True
    return True


def remove_multi_worker_fixes() -> None:
    """Undo `apply_multi_worker_fixes` (for tests that check upstream behaviour)."""
    global _applied
    tf_trainer.reduce_per_replica = _original_reduce_per_replica
    _applied = False
    _restore_symbolic_build_if_unused()


def _restore_symbolic_build_if_unused() -> None:
    if not _applied and not _uneven_applied:
        TRAINER._maybe_symbolic_build = _original_symbolic_build


def is_multi_worker(strategy: Any) -> bool:
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and bool(
        getattr(strategy.extended, "_in_multi_worker_mode", lambda: False)()
    )


def _reduce_per_replica(values: Any, strategy: Any, reduction: str) -> Any:
    if not is_multi_worker(strategy) or reduction not in ("auto", "mean"):
        return _original_reduce_per_replica(values, strategy, reduction)

    def reduce_one(value: Any) -> Any:
        if isinstance(value, tf.distribute.DistributedValues) or tf.is_tensor(value):
            rank = value.values[0].shape.rank if hasattr(value, "values") else value.shape.rank
            return strategy.reduce("MEAN", value, axis=None if rank == 0 else 0)
        return value

    return tf.nest.map_structure(reduce_one, values)


def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
    """Build from this process's replicas' slices of the first batch, concatenated (the build
    needs only shapes and dtypes), instead of Keras's cross-replica MEAN of it."""
    strategy = self._distribute_strategy
    local = _uneven_applied or (_applied and is_multi_worker(strategy))
    if strategy is None or iterator is None or not local:
        return _original_symbolic_build(self, iterator=iterator, data_batch=data_batch)
    for _, _, batches in iterator:
        data_batch = local_batch(strategy, next(batches))
        break
    with strategy.scope():
        self._symbolic_build(data_batch=data_batch)


def local_batch(strategy: Any, batch: Any) -> Any:
    """A distributed batch as one batch of this process: its replicas' slices, concatenated."""
    def concat(value: Any) -> Any:
        if isinstance(value, tf.distribute.DistributedValues):
            return tf.concat(strategy.experimental_local_results(value), axis=0)
        return value

    return tf.nest.map_structure(concat, batch)


# Keras releases whose fit, evaluate and predict under a mirrored strategy fail on a global batch
# split unevenly over the replicas, and weight such a split wrongly (3.15.1 checked).
UNEVEN_BATCH_FIX_VERSIONS = ((3, 0), (3, 16))
_uneven_applied = False
_original_compute_loss = TRAINER.compute_loss
_original_scale_loss = loss_module.scale_loss_for_distribution
_original_unscale_loss = loss_module.unscale_loss_for_distribution
_replica_share = threading.local()


def keras_needs_uneven_batch_fixes(version: str = keras.__version__) -> bool:
    """Whether this Keras version is known to mishandle a batch split unevenly over replicas."""
    return _version_within(version, UNEVEN_BATCH_FIX_VERSIONS)


def apply_uneven_batch_fixes(force: bool = False) -> bool:
    """Make Keras's fit/evaluate/predict take a global batch that does not split evenly over a
    mirrored strategy's replicas (64 over 3, or a last partial batch), with the single-device
    result; idempotent. `force`: whatever the version. Returns whether the patches are in place."""
    global _uneven_applied
    if _uneven_applied or not (force or keras_needs_uneven_batch_fixes()):
        return _uneven_applied
    TRAINER._maybe_symbolic_build = _maybe_symbolic_build
    TRAINER.compute_loss = _compute_loss
    loss_module.scale_loss_for_distribution = _scale_loss
    loss_module.unscale_loss_for_distribution = _unscale_loss
    _uneven_applied = True
    return True


def remove_uneven_batch_fixes() -> None:
    """Undo `apply_uneven_batch_fixes` (for tests that check upstream behaviour)."""
    global _uneven_applied
    TRAINER.compute_loss = _original_compute_loss
    loss_module.scale_loss_for_distribution = _original_scale_loss
    loss_module.unscale_loss_for_distribution = _original_unscale_loss
    _uneven_applied = False
    _restore_symbolic_build_if_unused()


def _compute_loss(self: Any, x: Any = None, y: Any = None, y_pred: Any = None, sample_weight: Any = None,
                  training: bool = True) -> Any:
    """Keras's `compute_loss` (where every loss it scales for distribution is made), with this
    replica's share of the global batch's rows known to that scaling while the step is traced.
    A model whose own `compute_loss` never calls this one keeps Keras's 1/replicas."""
    _replica_share.value = _rows_share(x)
    return _original_compute_loss(self, x, y, y_pred, sample_weight, training=training)


def _rows_share(x: Any) -> Any:
    """rows of this replica / rows of all replicas, inside a mirrored strategy's replica
    function; None elsewhere (one replica, the symbolic build, another strategy)."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync < 2:
        return None
    if not isinstance(context.strategy, (tf.distribute.MirroredStrategy,
                                         tf.distribute.MultiWorkerMirroredStrategy)):
        return None
    first = next((value for value in tf.nest.flatten(x) if value is not None), None)
    if first is None or not tf.is_tensor(first):
        return None
    rows = tf.cast(tf.shape(first)[0], tf.float32)
    return tf.math.divide_no_nan(rows, context.all_reduce("SUM", rows))


def _current_share() -> Any:
    """The share `_compute_loss` recorded for the step being traced (or run eagerly) by this
    replica's thread, if any."""
    share = getattr(_replica_share, "value", None)
    in_graph = share is not None and hasattr(share, "graph")  # an eager tensor has no graph
    if share is None or tf.executing_eagerly() == in_graph:
        return None
    return None if in_graph and share.graph is not tf.compat.v1.get_default_graph() else share


def _scale_loss(value: Any) -> Any:
    """A replica's mean loss times its share of the rows, where Keras multiplies by
    1/replicas: summed over the replicas, the mean over the global batch, also when the replicas
    have different numbers of rows."""
    share = _current_share()
    if share is None:
        return _original_scale_loss(value)
    return value * tf.cast(share, value.dtype)


def _unscale_loss(value: Any) -> Any:
    share = _current_share()
    if share is None:
        return _original_unscale_loss(value)
    return tf.math.divide_no_nan(value, tf.cast(share, value.dtype))  # a replica with 0 rows: 0


# Keras releases whose TensorFlow optimizers create their variables (Adam's moments, SGD's
# momentum) where the first `apply_gradients` runs: inside the user's traced step under
# `strategy.run` that fails on TensorFlow 2.21 (keras-team/keras#23085; fixed by keras#23087,
# after 3.15.1).
OPTIMIZER_VARIABLES_FIX_VERSIONS = ((3, 0), (3, 16))
_optimizer_applied = False
_original_add_variable = tf_optimizer.TFOptimizer.add_variable


def keras_needs_optimizer_variables_fix(version: str = keras.__version__) -> bool:
    return _version_within(version, OPTIMIZER_VARIABLES_FIX_VERSIONS)


def apply_optimizer_variables_fix(force: bool = False) -> bool:
    """Create TensorFlow optimizer variables outside the function being traced, as keras#23087
    does; idempotent. `force`: whatever the version. Returns whether the patch is in place."""
    global _optimizer_applied
    if _optimizer_applied or not (force or keras_needs_optimizer_variables_fix()):
        return _optimizer_applied
    tf_optimizer.TFOptimizer.add_variable = _add_variable
    _optimizer_applied = True
    return True


def remove_optimizer_variables_fix() -> None:
    """Undo `apply_optimizer_variables_fix` (for tests that check upstream behaviour)."""
    global _optimizer_applied
    tf_optimizer.TFOptimizer.add_variable = _original_add_variable
    _optimizer_applied = False


def _add_variable(self: Any, *args: Any, **kwargs: Any) -> Any:
    with tf.init_scope():
        return _original_add_variable(self, *args, **kwargs)


def apply_keras_fixes(force: bool = False) -> None:
    """Every Keras patch above that this Keras needs (what `import kerasdist` does); `force`: all
    of them, whatever the version (make upstream-check tries them on the next Keras so)."""
    apply_multi_worker_fixes(force)
    apply_uneven_batch_fixes(force)
    apply_optimizer_variables_fix(force)


def remove_keras_fixes() -> None:
    """Keras as released, for tests that check upstream behaviour."""
    remove_multi_worker_fixes()
    remove_uneven_batch_fixes()
    remove_optimizer_variables_fix()


@contextlib.contextmanager
def keras_as_released() -> Iterator[None]:
    """Within the block, Keras without kerasdist's patches (the canaries run the reporters'
    code so); the patches that were in place come back after it."""
    applied = (_applied, _uneven_applied, _optimizer_applied)
    remove_keras_fixes()
    try:
        yield
    finally:
        remove_keras_fixes()  # also what the block put in place
        for was_applied, apply in zip(applied, (apply_multi_worker_fixes, apply_uneven_batch_fixes,
                                                apply_optimizer_variables_fix), strict=True):
            if was_applied:
                apply(force=True)  # as it was, whatever the version


# TensorFlow releases whose MultiWorkerMirroredStrategy, made too late, says only this (2.21 checked).
LATE_COLLECTIVES_VERSIONS = ((2, 0), (2, 22))
LATE_COLLECTIVES_MESSAGE = "Collective ops must be configured at program startup"
_original_multi_worker_init = tf.distribute.MultiWorkerMirroredStrategy.__init__


class MultiWorkerStrategyTooLate(RuntimeError):
    """A MultiWorkerMirroredStrategy was made after TensorFlow's runtime had started."""

    def __init__(self) -> None:
        super().__init__(
            "MultiWorkerMirroredStrategy must be created before TensorFlow runs anything in this "
            f"process (TensorFlow: '{LATE_COLLECTIVES_MESSAGE}'). Create it first, before any "
            "dataset, tensor, model or make_dataset(); or call select_strategy() first, which "
            "creates it. From R, keras3 starts TensorFlow as soon as Python's keras is imported: "
            "create it before library(keras3), or call kerasdist::select_strategy(\"multi_worker\") "
            "before any keras3 function."
        )


def explain_late_multi_worker_strategy() -> bool:
    """Make a MultiWorkerMirroredStrategy created too late raise `MultiWorkerStrategyTooLate`;
    idempotent. Returns whether the explanation is in place."""
    strategy_class = tf.distribute.MultiWorkerMirroredStrategy
    if not _version_within(tf.__version__, LATE_COLLECTIVES_VERSIONS):
        return False
    if strategy_class.__init__ is not _original_multi_worker_init:
        return True

    @functools.wraps(_original_multi_worker_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            _original_multi_worker_init(self, *args, **kwargs)
        except RuntimeError as err:
            if LATE_COLLECTIVES_MESSAGE not in str(err):
                raise
            raise MultiWorkerStrategyTooLate() from None

    strategy_class.__init__ = __init__
    return True


# TensorFlow releases whose MultiWorkerMirroredStrategy configures the coordination service only
# when none is configured yet, with the default heartbeat timeout (10 s: a SIGKILLed peer was seen
# after 9.5 s) and no argument to change it (2.21 checked).
COORDINATION_CONFIG_VERSIONS = ((2, 0), (2, 22))


def configure_coordination(cluster_spec: Any, heartbeat_timeout_seconds: float) -> bool:
    """Before a MultiWorkerMirroredStrategy is made: configure TensorFlow's coordination service
    as the strategy would (standalone, its leader, the chief and worker jobs), with a heartbeat
    timeout of `heartbeat_timeout_seconds`, so the strategy keeps it. The service declares a task
    dead when it has sent no heartbeat for that long; heartbeats come from a C++ thread (every
    half timeout), so a long step or save that holds Python's GIL does not stop them. Returns
    whether it configured (False on other TensorFlow versions, or when a service is configured
    already). tests/python/test_multi_worker.py fails when the strategy stops keeping it."""
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    if not _version_within(tf.__version__, COORDINATION_CONFIG_VERSIONS) or context.context().coordination_service:
        return False
    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
            for job in ("chief", "worker") if job in cluster_spec.jobs]
    context.context().configure_coordination_service(
        service_type="standalone", service_leader=multi_worker_util.coordination_leader(cluster_spec),
        coordinated_jobs=jobs, heartbeat_timeout_in_ms=max(1, round(heartbeat_timeout_seconds * 1000)))
    return True


def coordination_heartbeat_timeout_seconds() -> float | None:
    """The heartbeat timeout of the coordination service configured in this process, or None."""
    from tensorflow.python.eager import context

    config = context.context().coordination_service
    return config.heartbeat_timeout_in_ms / 1000 if config and config.heartbeat_timeout_in_ms else None


# Keras releases whose saving_lib caches its attribute skip-sets under a key it never reads
# (3.15.1 checked).
SAVING_SKIPSET_FIX_VERSIONS = ((3, 0), (3, 16))
_SKIPSET_TYPES = ("Operation", "Layer", "Functional", "Sequential", "Metric", "Optimizer", "Loss",
                  "Cross", "Feature")


def keras_needs_skipset_fix(version: str = keras.__version__) -> bool:
    return _version_within(version, SAVING_SKIPSET_FIX_VERSIONS)


def warm_saving_skipsets() -> None:
    """Fill the cache Keras's saving_lib reads its attribute skip-sets from. Must run outside
    any strategy scope (it makes reference objects, an Optimizer with variables among them).

    `saving_lib.get_attr_skipset` stores each set under "saving_attr_skipset_<type>" but looks
    for "saving_attr_skiplist_<type>", so every save and load makes its reference objects again,
    and a reference Optimizer's two variables inside a MultiWorkerMirroredStrategy scope are
    created by collectives that only the worker that loads joins ("Collective instance ...
    expected type 0 ... but got type 1" when only the chief restores). Filled once under the key
    it reads, the sets are never made in a scope. `keras.backend.clear_session()` empties the
    cache, so callers warm it before each restore (cheap when warm).
    """
    if not keras_needs_skipset_fix():
        return
    from keras.src.backend.common import global_state
    from keras.src.saving import saving_lib

    for obj_type in _SKIPSET_TYPES:
        key = f"saving_attr_skiplist_{obj_type}"
        if global_state.get_global_attribute(key) is None:
            global_state.set_global_attribute(key, saving_lib.get_attr_skipset(obj_type))


# TensorFlow releases whose PreemptionCheckpointHandler skips GCE CPU VMs (2.21 checked).
PREEMPTION_HANDLER_FIX_VERSIONS = ((2, 0), (2, 22))
_GCE_METADATA_VARIABLE = "GCE_METADATA_IP"  # failure_handling_util._GCE_METADATA_URL_ENV_VARIABLE


def tensorflow_needs_preemption_fix(version: str = tf.__version__) -> bool:
    return _version_within(version, PREEMPTION_HANDLER_FIX_VERSIONS)


@contextlib.contextmanager
def gce_metadata_probe_off() -> Iterator[None]:
    """While TensorFlow's PreemptionCheckpointHandler is made (`preemption/agreement.py`): its
    probe of the GCE metadata server refused at once, so it takes the path it takes on any host
    (on the TensorFlow versions that skip GCE CPU VMs; elsewhere nothing changes)."""
    if not tensorflow_needs_preemption_fix():
        yield
        return
    with _environment_variable_kept(_GCE_METADATA_VARIABLE):
        os.environ[_GCE_METADATA_VARIABLE] = "127.0.0.1:1"  # nothing listens on port 1: refused at once
        yield


@contextlib.contextmanager
def _environment_variable_kept(name: str):
    """Whatever the block does to the environment variable `name`, put it back as it was."""
    before = os.environ.get(name)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def save_if_preempted(handler: Any) -> None:
    """`handler.save_checkpoint_if_preempted()` without TensorFlow's deprecation notice (it
    reads its own deprecated `total_run_calls` when it saves)."""
    from tensorflow.python.util import deprecation

    with deprecation.silence():
        handler.save_checkpoint_if_preempted()


def slurm_gpu_share(resolver: Any) -> list[int]:
    """The GPUs (indices into the ones this process sees) that SlurmClusterResolver gives this task.

    The resolver hands them out by writing CUDA_VISIBLE_DEVICES while it resolves the cluster, but
    kerasdist has listed the GPUs before (to decide the strategy), and CUDA reads that variable only
    when it starts: the write changes nothing in this process. So the share is read back, and the
    variable is left as it was (one that Slurm set itself numbers the same GPUs differently).
    """
    with _environment_variable_kept("CUDA_VISIBLE_DEVICES"):
        resolver.cluster_spec()
        share = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return [int(index) for index in share.split(",") if index.strip()]


def show_only_gpus(indices: list[int]) -> None:
    """Make only these of the listed GPUs visible to TensorFlow (the in-process equivalent of
    CUDA_VISIBLE_DEVICES, valid until TensorFlow's runtime starts)."""
    gpus = tf.config.list_physical_devices("GPU")
    tf.config.set_visible_devices([gpus[index] for index in indices], "GPU")


def slurm_resolver(cluster: Any, gpus: list[str]) -> Any:
    """A cluster resolver for a Slurm job step: TensorFlow's own where it works (GPU nodes, where
    it also sets CUDA_VISIBLE_DEVICES to this task's share), else the same layout, read by
    `kerasdist.cluster.slurm_cluster`, in a SimpleClusterResolver."""
    if gpus:
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(gpus_per_node=len(gpus))
        show_only_gpus(slurm_gpu_share(resolver))
        return resolver
    if not cluster.cluster:
        raise ValueError(
            "Slurm declares several tasks but SLURM_STEP_NODELIST / SLURM_STEP_TASKS_PER_NODE are "
            "not set: start the script with srun."
        )
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster.cluster), task_type="worker", task_id=cluster.task_index,
        rpc_layer="grpc",
    )


# TensorFlow releases whose tf.data runs Grappler on every function of every new iterator (2.21 checked).
DATA_FUNCTION_FIX_VERSIONS = ((2, 0), (2, 22))
_ON_ITS_DEVICE = {"experimental_ints_on_device": True}  # captured_function.cc: single-device, no Grappler


def tensorflow_optimizes_data_functions(version: str = tf.__version__) -> bool:
    return _version_within(version, DATA_FUNCTION_FIX_VERSIONS)


def map_on_cpu(dataset: tf.data.Dataset, fn: Callable[..., Any]) -> tf.data.Dataset:
    """`dataset.map(fn)`, with `fn` instantiated for each new iterator without Grappler, unless it
    returns int32 tensors: under the mark those become `_DeviceRetval` nodes, which tf.data's own
    graph optimizers (inject_prefetch, with autotuning on) do not take for a function's results,
    so a function with two results, one of them int32, fails when an iterator is made ("Expected
    only one fetch node"). Such a function is mapped as usual."""
    if tensorflow_optimizes_data_functions():
        marked = _marked_function(fn, "Dataset.map()", dataset)
        if not any(spec.dtype == tf.int32 for spec in tf.nest.flatten(marked.output_structure)):
            return _SingleDeviceFunctionDataset(dataset, marked, flat=False)
    return dataset.map(fn)


def flat_map_on_cpu(dataset: tf.data.Dataset, fn: Callable[..., Any]) -> tf.data.Dataset:
    """`dataset.flat_map(fn)`, with `fn` instantiated for each new iterator without Grappler (its
    one result is a dataset, never an int32 tensor)."""
    if not tensorflow_optimizes_data_functions():
        return dataset.flat_map(fn)
    return _SingleDeviceFunctionDataset(dataset, _marked_function(fn, "Dataset.flat_map()", dataset), flat=True)


def _marked_function(fn: Callable[..., Any], transformation: str, dataset: Any) -> Any:
    """`fn` traced for `dataset`'s elements with the single-device mark. Not yet added to the
    graph being built (inside another dataset function): the dataset op that uses it adds it, and
    an unused marked function would still be optimized, and could fail, with the others."""
    return structured_function.StructuredFunctionWrapper(
        fn, transformation, dataset=dataset, add_to_graph=False, defun_kwargs=dict(_ON_ITS_DEVICE))


class _SingleDeviceFunctionDataset(dataset_ops.UnaryDataset):
    """tf.data's MapDataset or FlatMapDataset as `Dataset.map` / `flat_map` build them (map_op.py,
    flat_map_op.py), over a function traced by `_marked_function`."""

    def __init__(self, input_dataset: Any, marked: Any, flat: bool):
        self._input_dataset = input_dataset
        self._fn = marked
        output = marked.output_structure
        self._structure = output._element_spec if flat else output
        self._name = None
        function, upstream = marked.function, input_dataset._variant_tensor
        if flat:
            variant = gen_dataset_ops.flat_map_dataset(
                upstream, function.captured_inputs, f=function, **self._common_args)
        else:
            variant = gen_dataset_ops.map_dataset(
                upstream, function.captured_inputs, f=function, use_inter_op_parallelism=True,
                preserve_cardinality=True, force_synchronous=False, **self._common_args)
        super().__init__(input_dataset, variant)

    def _functions(self) -> list[Any]:
        return [self._fn]

    @property
    def element_spec(self) -> Any:
        return self._structure


# Keras releases whose saving internals `checkpoint/snapshot.py` records (3.15.1 checked): the
# model walk `saving_lib._save_state`, `_serialize_model_as_json`, `H5IOStore` and `DiskIOStore`,
# and the names of the files in a `.keras` zip.
KERAS_SNAPSHOT_VERSIONS = ((3, 15), (3, 16))


def keras_snapshot_supported(version: str = keras.__version__) -> bool:
    """Whether background checkpoint saves may snapshot this Keras's models cheaply (else they
    write the whole model on the training thread, as a synchronous save does)."""
    return _version_within(version, KERAS_SNAPSHOT_VERSIONS)


def keras_model_bytes(model: Any) -> bytes:
    """The `.keras` archive of `model` (what `model.save("x.keras")` writes) as bytes."""
    import io

    try:
        from keras.src.saving import saving_lib
    except ImportError:  # the library moved: the same archive through a temporary file
        saving_lib = None
    if saving_lib is not None:
        archive = io.BytesIO()
        saving_lib.save_model(model, archive)
        return archive.getvalue()
    with tempfile.TemporaryDirectory(prefix="kerasdist-save-") as temp:
        path = os.path.join(temp, "model.keras")
        model.save(path)
        with open(path, "rb") as stream:
            return stream.read()


# Keras releases whose CallbackList calls each callback's hook from a method of its own, the list
# being that method's `self` (3.15.1 checked): how a checkpoint callback finds the callbacks beside
# it in a `fit` it did not build (a canary in test_callback_state.py).
CALLBACK_LIST_VERSIONS = ((3, 0), (3, 16))


def calling_callback_list(depth: int = 6) -> Any:
    """The `keras.callbacks.CallbackList` whose hook is running the caller's hook, or None (a hook
    called directly, or a Keras outside `CALLBACK_LIST_VERSIONS`)."""
    if not _version_within(keras.__version__, CALLBACK_LIST_VERSIONS):
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
