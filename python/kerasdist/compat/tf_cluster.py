"""TensorFlow's cluster tools on hosts they were not written for: the PreemptionCheckpointHandler,
which does nothing on GCE CPU VMs (`gce_metadata_probe_off`), and the SlurmClusterResolver, which
fails on CPU-only nodes and hands GPUs out through a variable read too late (`slurm_resolver`);
its helpers that read Slurm's host lists live in a private module (`slurm_tasks_per_host`).
Why and the canaries: docs/upstream.md."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from kerasdist.compat.versions import version_within

# TensorFlow releases whose PreemptionCheckpointHandler skips GCE CPU VMs (2.21 checked).
PREEMPTION_HANDLER_FIX_VERSIONS = ((2, 0), (2, 22))
_GCE_METADATA_VARIABLE = "GCE_METADATA_IP"  # failure_handling_util._GCE_METADATA_URL_ENV_VARIABLE


def tensorflow_needs_preemption_fix(version: str = tf.__version__) -> bool:
    return version_within(version, PREEMPTION_HANDLER_FIX_VERSIONS)


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
def _environment_variable_kept(name: str) -> Iterator[None]:
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


def slurm_tasks_per_host(nodes: str, tasks: str) -> dict[str, int]:
    """Slurm's node list (`SLURM_STEP_NODELIST`, e.g. "n[1-2]") and tasks per node
    (`SLURM_STEP_TASKS_PER_NODE`, e.g. "2(x2)") as {host: tasks}, read by the helpers
    SlurmClusterResolver reads them with and paired as it pairs them (a plain zip: a surplus host
    or count is dropped)."""
    from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import (
        expand_hostlist,
        expand_tasks_per_node,
    )

    return dict(zip(expand_hostlist(nodes), expand_tasks_per_node(tasks), strict=False))


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
