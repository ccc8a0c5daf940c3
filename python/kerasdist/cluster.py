"""Cluster signals: TF_CONFIG (Kubernetes operators, the launcher, hand-written) and Slurm.

Everything here is pure parsing of an environment mapping, so the rules can be tested on any
machine by passing the environment a cluster would set.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kerasdist.validation import integer

WORKER_TYPES = ("chief", "worker")
SLURM_PORT_BASE = 8888  # SlurmClusterResolver's default: task k on a node listens on base + k
TASK_TYPES = ("chief", "worker", "ps", "evaluator")


@dataclass(frozen=True)
class ClusterInfo:
    """Where this process sits in a cluster.

    Attributes:
        source: "TF_CONFIG", "Slurm" or "none".
        cluster: task type -> list of "host:port" addresses (for Slurm, the workers laid out
            as TensorFlow's SlurmClusterResolver does, `slurm_cluster`; empty when the step's
            node list is not in the environment).
        task_type: this process's role, or None outside a cluster.
        task_index: this process's index within its role, or None.
        num_workers: tasks that train: workers, plus the chief except in parameter-server
            clusters, where the chief is the coordinator.
        num_ps: parameter-server tasks.
    """

    source: str = "none"
    cluster: dict[str, list[str]] = field(default_factory=dict)
    task_type: str | None = None
    task_index: int | None = None
    num_workers: int = 1
    num_ps: int = 0

    @property
    def is_chief(self) -> bool:
        """The chief writes checkpoints and logs: task "chief", or worker 0 when there is none."""
        if self.task_type is None:
            return True
        if self.task_type == "chief":
            return True
        has_chief = bool(self.cluster.get("chief"))
        return self.task_type == "worker" and self.task_index == 0 and not has_chief


def parse_tf_config(tf_config: str | Mapping[str, Any]) -> ClusterInfo:
    """Validate a TF_CONFIG value (JSON text or a dict) and describe the cluster it declares.

    Raises:
        ValueError: naming what is wrong: not JSON, no "cluster" or "task", an unknown task type,
            or a task index outside the cluster.
    """
    config = _load_tf_config(tf_config)
    cluster = _validate_cluster(config.get("cluster"))
    task_type, task_index = _validate_task(config.get("task"), cluster)
    return ClusterInfo(
        source="TF_CONFIG",
        cluster=cluster,
        task_type=task_type,
        task_index=task_index,
        num_workers=_trainers(cluster),
        num_ps=len(cluster.get("ps", [])),
    )


def _trainers(cluster: Mapping[str, list[str]]) -> int:
    """Tasks that run training steps: workers, and the chief unless it is a parameter-server
    coordinator (which only schedules)."""
    chief = 0 if cluster.get("ps") else len(cluster.get("chief", []))
    return len(cluster.get("worker", [])) + chief


def cluster_from_environment(environ: Mapping[str, str] | None = None) -> ClusterInfo:
    """Read the cluster this process belongs to: TF_CONFIG first, then Slurm, else none."""
    env = os.environ if environ is None else environ
    if env.get("TF_CONFIG", "").strip():
        return parse_tf_config(env["TF_CONFIG"])
    slurm_tasks = _slurm_task_count(env)
    if slurm_tasks > 1:
        return ClusterInfo(
            source="Slurm",
            cluster=slurm_cluster(env),
            task_type="worker",
            task_index=_int_env(env, "SLURM_PROCID", 0),
            num_workers=slurm_tasks,
        )
    return ClusterInfo()


def cluster_of_resolver(resolver: Any) -> ClusterInfo:
    """The cluster a TensorFlow cluster resolver describes (a coordinator-side one: this process is the chief)."""
    spec = resolver.cluster_spec().as_dict()
    if not spec:
        return ClusterInfo()
    cluster = {k: list(v.values()) if isinstance(v, dict) else list(v) for k, v in spec.items()}
    task = {"type": resolver.task_type, "index": resolver.task_id or 0}
    if task["type"] is None:  # a coordinator-side resolver: this process is the chief
        task = {"type": "chief", "index": 0}
        cluster.setdefault("chief", ["localhost:0"])
    return parse_tf_config({"cluster": cluster, "task": task})


def slurm_cluster(env: Mapping[str, str], port_base: int = SLURM_PORT_BASE) -> dict[str, list[str]]:
    """The worker addresses of a Slurm job step, laid out as TensorFlow's SlurmClusterResolver
    does (hosts sorted, task k of a node on port_base + k), parsed with TensorFlow's own helpers.
    Empty when the step's node list is not in the environment."""
    from kerasdist import compat

    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    tasks = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not nodes or not tasks:
        return {}
    per_node = compat.slurm_tasks_per_host(nodes, tasks)
    workers = [f"{host}:{port_base + k}" for host, count in sorted(per_node.items()) for k in range(count)]
    return {"worker": workers}


def _load_tf_config(tf_config: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(tf_config, Mapping):
        return dict(tf_config)
    if not isinstance(tf_config, str):
        raise ValueError(
            f"TF_CONFIG must be JSON text or a dict, got {type(tf_config).__name__}."
        )
    try:
        config = json.loads(tf_config)
    except json.JSONDecodeError as err:
        raise ValueError(f"TF_CONFIG is not valid JSON ({err.msg} at character {err.pos}).") from None
    if not isinstance(config, dict):
        raise ValueError(f"TF_CONFIG must be a JSON object, got {type(config).__name__}.")
    return config


def _validate_cluster(cluster: Any) -> dict[str, list[str]]:
    if not isinstance(cluster, Mapping) or not cluster:
        raise ValueError(
            'TF_CONFIG has no "cluster": expected e.g. {"cluster": {"worker": ["host:port", ...]}, '
            '"task": {"type": "worker", "index": 0}}.'
        )
    result: dict[str, list[str]] = {}
    for task_type, addresses in cluster.items():
        if task_type not in TASK_TYPES:
            raise ValueError(
                f'TF_CONFIG cluster has unknown task type "{task_type}"; expected one of '
                f"{', '.join(TASK_TYPES)}."
            )
        if isinstance(addresses, str):  # one address (R turns a length-1 vector into a string)
            addresses = [addresses]
        if not isinstance(addresses, (list, tuple)):
            raise ValueError(
                f'TF_CONFIG cluster["{task_type}"] must be a list of "host:port" addresses.'
            )
        result[task_type] = [str(a) for a in addresses]
    if not any(result.get(t) for t in WORKER_TYPES):
        raise ValueError('TF_CONFIG cluster has no "chief" or "worker" task to train on.')
    return result


def _validate_task(task: Any, cluster: Mapping[str, list[str]]) -> tuple[str, int]:
    if not isinstance(task, Mapping) or "type" not in task:
        raise ValueError(
            'TF_CONFIG has no "task": every process needs {"task": {"type": ..., "index": ...}} '
            "saying which entry of the cluster it is."
        )
    task_type = task["type"]
    if task_type not in cluster:
        raise ValueError(
            f'TF_CONFIG task type "{task_type}" is not in the cluster, which has '
            f"{', '.join(cluster)}."
        )
    index = integer("TF_CONFIG task index", task.get("index", 0))
    size = len(cluster[task_type])
    if not 0 <= index < size:
        raise ValueError(
            f'TF_CONFIG task index {index} is out of range: the cluster has {size} "{task_type}" '
            f"task(s), so the index must be 0 to {size - 1}."
        )
    return task_type, index


def _slurm_task_count(env: Mapping[str, str]) -> int:
    if "SLURM_JOB_ID" not in env and "SLURM_PROCID" not in env:
        return 0
    return _int_env(env, "SLURM_STEP_NUM_TASKS", _int_env(env, "SLURM_NTASKS", 1))


def _int_env(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}.") from None
