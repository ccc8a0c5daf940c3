"""Workarounds for upstream bugs and gaps, one module per upstream concern, each workaround small,
gated on the versions that need it (`versions.version_within`) and with a canary test that fails
when upstream changes (so the shim can go). Each one, why it is needed and its test:
docs/upstream.md ("How each workaround works"); `make upstream-check` tries them on the next
Keras and TensorFlow (tools/upstream_check.py).

- `keras_training`: Keras 3 `fit` under MultiWorkerMirroredStrategy (keras#20585,
  tensorflow#72388), an uneven global batch under a mirrored strategy, keras#23085's optimizer
  variables: applied at `import kerasdist`, lifted for a block by `keras_as_released()`; and what
  kerasdist reads of a model that Keras keeps private (`layers_within`, `compiled_metrics`,
  `wrapped_function`, `optimizer_batch_counter`, `symbolic_build`);
- `keras_variables`: Keras variables' `assign_add`/`assign_sub` as one atomic update, while a
  parameter-server step is traced (`atomic_variable_increments`); a variable's replicas
  (`replica_variables`);
- `keras_saving`: Keras saving's skip-set cache (`warm_saving_skipsets`), `save_model` into memory
  (`keras_model_bytes`), and `model.save` in two halves for background snapshots
  (`keras_snapshot_supported`, `record_save`, `write_keras_zip`);
- `keras_loading`: `model.load_weights(x.keras)` reading the weights member in place, each value
  straight into the tensor its variable takes over (`load_keras_weights`), and a build to be
  restored at once without its random initializers, large variables unfilled
  (`initializers_deferred`);
- `keras_callbacks`: the `CallbackList` a callback is called from (`calling_callback_list`), the
  private attributes ModelCheckpoint and TensorBoard keep state in;
- `tf_distribute`: a MultiWorkerMirroredStrategy made too late
  (`explain_late_multi_worker_strategy`, applied at import), the coordination service's
  heartbeat timeout (`configure_coordination`), its key-value store and barriers
  (`coordination_key_exists`, `wait_at_coordination_barrier`, `coordination_store`);
- `tf_collectives`: the seconds this process's all-reduces took, per worker (`CollectiveWaits`,
  `time_collectives`), for the step times that name a straggler;
- `tf_cluster`: the preemption handler's GCE probe (`gce_metadata_probe_off`) and TensorFlow's
  SlurmClusterResolver on CPU-only nodes (`slurm_resolver`, `slurm_tasks_per_host`);
- `tf_data`: tf.data's Grappler pass per iterator (`map_on_cpu`, `flat_map_on_cpu`);
- `tf_data_state`: a dataset's graph (`dataset_graph`) and an iterator's position as bytes
  (`iterator_state`, `restore_iterator_state`; `SYMBOLIC_REFUSED`), and whether a state holds
  every shuffle's random state (`shuffle_counts_kept`);
- `keras_data`: Keras's fit fed one batch per step from kerasdist's stream (`keras_stream`), and
  `model.fit` with a kerasdist checkpoint callback resumed by kerasdist (`route_fit`).

Callers use the names below (`from kerasdist import compat; compat.map_on_cpu(...)`), which are
only those used outside this package (tests/python/test_layout.py checks); tests that look inside
a workaround import its module.
"""

from kerasdist.compat.keras_callbacks import (
    MODEL_CHECKPOINT_COUNTERS,
    TENSORBOARD_COUNTERS,
    calling_callback_list,
    tensorboard_writers,
)
from kerasdist.compat.keras_data import fit_unrouted, keras_stream, route_fit
from kerasdist.compat.keras_loading import (
    initializers_deferred,
    keras_defers_initializers,
    keras_loads_weights_in_place,
    load_keras_weights,
    tensorflow_reads_into_tensors,
    variable_bytes,
)
from kerasdist.compat.keras_saving import (
    RecordedSave,
    keras_model_bytes,
    keras_needs_skipset_fix,
    keras_snapshot_supported,
    record_save,
    recording_store,
    warm_saving_skipsets,
    write_keras_zip,
    zip_crc_later_supported,
)
from kerasdist.compat.keras_training import (
    TRAINER,
    apply_keras_fixes,
    apply_multi_worker_fixes,
    apply_uneven_batch_fixes,
    compiled_metrics,
    is_multi_worker,
    keras_as_released,
    keras_needs_multi_worker_fixes,
    keras_needs_optimizer_variables_fix,
    keras_needs_uneven_batch_fixes,
    layers_within,
    optimizer_batch_counter,
    remove_keras_fixes,
    symbolic_build,
    wrapped_function,
)
from kerasdist.compat.keras_variables import (
    atomic_variable_increments,
    keras_needs_atomic_increments,
    replica_variables,
)
from kerasdist.compat.tf_cluster import (
    gce_metadata_probe_off,
    save_if_preempted,
    slurm_gpu_share,
    slurm_resolver,
    slurm_tasks_per_host,
    tensorflow_needs_preemption_fix,
)
from kerasdist.compat.tf_collectives import CollectiveWaits, time_collectives
from kerasdist.compat.tf_data import flat_map_on_cpu, map_on_cpu
from kerasdist.compat.tf_data_state import (
    SYMBOLIC_REFUSED,
    dataset_graph,
    dataset_output,
    iterator_state,
    restore_iterator_state,
    shuffle_counts_kept,
)
from kerasdist.compat.tf_distribute import (
    LATE_COLLECTIVES_VERSIONS,
    MultiWorkerStrategyTooLate,
    configure_coordination,
    coordination_heartbeat_timeout_seconds,
    coordination_key_exists,
    coordination_store,
    explain_late_multi_worker_strategy,
    wait_at_coordination_barrier,
)
from kerasdist.compat.versions import version_within

__all__ = [
    "CollectiveWaits", "LATE_COLLECTIVES_VERSIONS", "MODEL_CHECKPOINT_COUNTERS", "TENSORBOARD_COUNTERS", "TRAINER",
    "MultiWorkerStrategyTooLate", "RecordedSave", "apply_keras_fixes", "apply_multi_worker_fixes",
    "apply_uneven_batch_fixes", "atomic_variable_increments", "calling_callback_list", "compiled_metrics",
    "configure_coordination", "coordination_heartbeat_timeout_seconds", "coordination_key_exists", "coordination_store",
    "explain_late_multi_worker_strategy", "flat_map_on_cpu", "gce_metadata_probe_off",
    "initializers_deferred", "is_multi_worker", "keras_as_released", "keras_defers_initializers",
    "keras_loads_weights_in_place", "keras_model_bytes", "keras_needs_atomic_increments",
    "keras_needs_multi_worker_fixes", "keras_needs_optimizer_variables_fix", "keras_needs_skipset_fix",
    "keras_needs_uneven_batch_fixes", "keras_snapshot_supported", "layers_within", "load_keras_weights",
    "map_on_cpu", "optimizer_batch_counter", "record_save", "recording_store", "remove_keras_fixes",
    "replica_variables", "save_if_preempted", "slurm_gpu_share", "slurm_resolver", "slurm_tasks_per_host",
    "symbolic_build", "time_collectives", "tensorboard_writers", "tensorflow_needs_preemption_fix",
    "tensorflow_reads_into_tensors", "variable_bytes", "version_within", "wait_at_coordination_barrier",
    "warm_saving_skipsets", "wrapped_function", "write_keras_zip", "zip_crc_later_supported",
    # the data users bring, resumable (data/resumable.py)
    "SYMBOLIC_REFUSED", "dataset_graph", "dataset_output", "fit_unrouted", "iterator_state", "keras_stream",
    "restore_iterator_state", "route_fit", "shuffle_counts_kept",
]
