"""Workarounds for upstream bugs and gaps, one module per upstream concern, each workaround small,
gated on the versions that need it (`versions.version_within`) and with a canary test that fails
when upstream changes (so the shim can go). Each one, why it is needed and its test:
docs/upstream.md ("How each workaround works"); `make upstream-check` tries them on the next
Keras and TensorFlow (tools/upstream_check.py).

- `keras_training`: Keras 3 `fit` under MultiWorkerMirroredStrategy (keras#20585,
  tensorflow#72388), an uneven global batch under a mirrored strategy, keras#23085's optimizer
  variables: applied at `import kerasdist`, lifted for a block by `keras_as_released()`;
- `keras_variables`: Keras variables' `assign_add`/`assign_sub` as one atomic update, while a
  parameter-server step is traced (`atomic_variable_increments`);
- `keras_saving`: Keras saving's skip-set cache (`warm_saving_skipsets`), `save_model` into memory
  (`keras_model_bytes`), and `model.save` in two halves for background snapshots
  (`keras_snapshot_supported`, `record_save`, `write_keras_zip`);
- `keras_loading`: `model.load_weights(x.keras)` reading the weights member in place, each value
  straight into the tensor its variable takes over (`load_keras_weights`), and a build to be
  restored at once without its random initializers, large variables unfilled
  (`initializers_deferred`);
- `keras_callbacks`: the `CallbackList` a callback is called from (`calling_callback_list`);
- `tf_distribute`: a MultiWorkerMirroredStrategy made too late
  (`explain_late_multi_worker_strategy`, applied at import), the coordination service's
  heartbeat timeout (`configure_coordination`) and its key-value store (`coordination_store`);
- `tf_collectives`: the seconds this process's all-reduces took, per worker (`CollectiveWaits`,
  `time_collectives`), for the step times that name a straggler;
- `tf_cluster`: the preemption handler's GCE probe (`gce_metadata_probe_off`) and TensorFlow's
  SlurmClusterResolver on CPU-only nodes (`slurm_resolver`);
- `tf_data`: tf.data's Grappler pass per iterator (`map_on_cpu`, `flat_map_on_cpu`).

Callers use the names below (`from kerasdist import compat; compat.map_on_cpu(...)`); tests that
look inside a workaround import its module.
"""

from kerasdist.compat.keras_callbacks import CALLBACK_LIST_VERSIONS, calling_callback_list
from kerasdist.compat.keras_loading import (
    KERAS_DEFERRED_INIT_VERSIONS,
    KERAS_LOAD_IN_PLACE_VERSIONS,
    TF_TENSOR_VIEW_VERSIONS,
    UNFILLED_FROM_BYTES,
    DeferredInitializers,
    initializers_deferred,
    keras_defers_initializers,
    keras_loads_weights_in_place,
    load_keras_weights,
    tensorflow_reads_into_tensors,
    variable_bytes,
)
from kerasdist.compat.keras_saving import (
    KERAS_SNAPSHOT_VERSIONS,
    SAVING_SKIPSET_FIX_VERSIONS,
    RecordedSave,
    SavedEntry,
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
    MULTI_WORKER_FIX_VERSIONS,
    OPTIMIZER_VARIABLES_FIX_VERSIONS,
    TRAINER,
    UNEVEN_BATCH_FIX_VERSIONS,
    apply_keras_fixes,
    apply_multi_worker_fixes,
    apply_optimizer_variables_fix,
    apply_uneven_batch_fixes,
    is_multi_worker,
    keras_as_released,
    keras_needs_multi_worker_fixes,
    keras_needs_optimizer_variables_fix,
    keras_needs_uneven_batch_fixes,
    local_batch,
    remove_keras_fixes,
    remove_multi_worker_fixes,
    remove_optimizer_variables_fix,
    remove_uneven_batch_fixes,
)
from kerasdist.compat.keras_variables import (
    ASSIGN_ADD_FIX_VERSIONS,
    atomic_variable_increments,
    keras_needs_atomic_increments,
)
from kerasdist.compat.tf_cluster import (
    PREEMPTION_HANDLER_FIX_VERSIONS,
    gce_metadata_probe_off,
    save_if_preempted,
    show_only_gpus,
    slurm_gpu_share,
    slurm_resolver,
    tensorflow_needs_preemption_fix,
)
from kerasdist.compat.tf_collectives import (
    COLLECTIVE_WAIT_VERSIONS,
    CollectiveWaits,
    tensorflow_times_collectives,
    time_collectives,
)
from kerasdist.compat.tf_data import (
    DATA_FUNCTION_FIX_VERSIONS,
    flat_map_on_cpu,
    map_on_cpu,
    tensorflow_optimizes_data_functions,
)
from kerasdist.compat.tf_distribute import (
    COORDINATION_CONFIG_VERSIONS,
    COORDINATION_STORE_VERSIONS,
    LATE_COLLECTIVES_MESSAGE,
    LATE_COLLECTIVES_VERSIONS,
    CoordinationStore,
    MultiWorkerStrategyTooLate,
    configure_coordination,
    coordination_heartbeat_timeout_seconds,
    coordination_store,
    explain_late_multi_worker_strategy,
)
from kerasdist.compat.versions import version_within

__all__ = [
    "ASSIGN_ADD_FIX_VERSIONS", "CALLBACK_LIST_VERSIONS", "COLLECTIVE_WAIT_VERSIONS", "COORDINATION_CONFIG_VERSIONS",
    "COORDINATION_STORE_VERSIONS", "CollectiveWaits", "CoordinationStore", "coordination_store",
    "tensorflow_times_collectives", "time_collectives",
    "DATA_FUNCTION_FIX_VERSIONS", "KERAS_DEFERRED_INIT_VERSIONS", "KERAS_LOAD_IN_PLACE_VERSIONS",
    "KERAS_SNAPSHOT_VERSIONS", "LATE_COLLECTIVES_MESSAGE",
    "LATE_COLLECTIVES_VERSIONS", "MULTI_WORKER_FIX_VERSIONS", "OPTIMIZER_VARIABLES_FIX_VERSIONS",
    "PREEMPTION_HANDLER_FIX_VERSIONS", "SAVING_SKIPSET_FIX_VERSIONS", "TF_TENSOR_VIEW_VERSIONS", "TRAINER",
    "UNEVEN_BATCH_FIX_VERSIONS", "UNFILLED_FROM_BYTES",
    "DeferredInitializers", "MultiWorkerStrategyTooLate", "RecordedSave", "SavedEntry",
    "apply_keras_fixes", "apply_multi_worker_fixes", "apply_optimizer_variables_fix", "apply_uneven_batch_fixes",
    "atomic_variable_increments", "calling_callback_list", "configure_coordination",
    "coordination_heartbeat_timeout_seconds", "explain_late_multi_worker_strategy", "flat_map_on_cpu",
    "gce_metadata_probe_off", "initializers_deferred", "is_multi_worker", "keras_as_released",
    "keras_defers_initializers", "keras_loads_weights_in_place", "keras_model_bytes",
    "keras_needs_atomic_increments", "keras_needs_multi_worker_fixes", "keras_needs_optimizer_variables_fix",
    "keras_needs_skipset_fix", "keras_needs_uneven_batch_fixes", "keras_snapshot_supported", "load_keras_weights",
    "local_batch", "map_on_cpu", "record_save", "recording_store", "remove_keras_fixes", "remove_multi_worker_fixes",
    "remove_optimizer_variables_fix", "remove_uneven_batch_fixes", "save_if_preempted", "show_only_gpus",
    "slurm_gpu_share", "slurm_resolver", "tensorflow_needs_preemption_fix", "tensorflow_optimizes_data_functions",
    "tensorflow_reads_into_tensors",
    "variable_bytes",
    "version_within", "warm_saving_skipsets", "write_keras_zip", "zip_crc_later_supported",
]
