"""Choosing a `tf.distribute` strategy from the hardware and the cluster signals, and saying why.

All the "auto" rules live in `_choose_kind`, in the order they are checked, so reading that one
function tells what "auto" does. `plan_strategy` decides without creating anything (so it can be
asked about hardware this machine lacks); `select_strategy` decides and builds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kerasdist.cluster import (
    ClusterInfo,
    cluster_from_environment,
    cluster_of_resolver,
    parse_tf_config,
)
from kerasdist.context import context_of, plan_of, remember_plan
from kerasdist.launch.supervisor import forming_cluster
from kerasdist.validation import choice, integer

# Set by R's simulate_devices() when it must split the CPU before keras3's load hook starts
# TensorFlow's devices; read (and removed) while kerasdist is imported.
DEVICES_VARIABLE = "KERASDIST_SIMULATE_DEVICES"


KINDS = ("auto", "default", "one_device", "mirrored", "multi_worker", "parameter_server", "tpu")
CROSS_DEVICE_OPS = ("nccl", "hierarchical_copy", "reduce_to_one_device")
COMMUNICATIONS = ("auto", "ring", "nccl")
TPU_ENV_VARS = ("TPU_NAME", "COLAB_TPU_ADDR")  # a TPU's name or address
# Set on a Cloud TPU VM to the chip type ("v4-8"): the TPU is this machine's own, not an address.
TPU_VM_ENV_VAR = "TPU_ACCELERATOR_TYPE"

@dataclass(frozen=True)
class StrategyPlan:
    """A decision: which strategy kind, on which devices, and the signal that chose it."""

    kind: str
    reason: str
    devices: tuple[str, ...] = ()
    cluster: ClusterInfo = field(default_factory=ClusterInfo)
    tpu: str | None = None

    def __str__(self) -> str:
        devices = ", ".join(self.devices) or "(strategy's choice)"
        return f"strategy:  {self.kind}\nwhy:       {self.reason}\ndevices:   {devices}"


@dataclass(frozen=True)
class StrategyDescription:
    """What `describe_strategy` reports; `str()` gives a readable summary."""

    kind: str
    reason: str
    num_replicas: int
    devices: tuple[str, ...]
    workers: int
    task: str | None
    is_chief: bool

    def __str__(self) -> str:
        lines = [
            f"strategy:  {self.kind}",
            f"why:       {self.reason}",
            f"replicas:  {self.num_replicas}",
            f"devices:   {', '.join(self.devices) or '(none listed)'}",
            f"workers:   {self.workers}",
            f"task:      {self.task or '(single process)'}",
            f"chief:     {'yes' if self.is_chief else 'no'}",
        ]
        return "\n".join(lines)


def plan_strategy(
    kind: str = "auto",
    *,
    devices: Sequence[str] | None = None,
    tf_config: str | Mapping[str, Any] | None = None,
    cluster_resolver: Any = None,
    environ: Mapping[str, str] | None = None,
    gpus: Sequence[str] | None = None,
    tpu: str | bool | None = None,
) -> StrategyPlan:
    """Decide which strategy to use and why, without creating it.

    Args:
        kind: "auto" (decide from the signals below) or one of "default", "one_device",
            "mirrored", "multi_worker", "parameter_server", "tpu".
        devices: devices to replicate on (mirrored) or place on (one_device), e.g. ["/gpu:0"].
        tf_config: a TF_CONFIG dict or JSON text to use instead of the TF_CONFIG variable.
        cluster_resolver: a `tf.distribute.cluster_resolver.ClusterResolver`; its cluster is used
            instead of TF_CONFIG.
        environ: the environment variables to read TF_CONFIG, SLURM_* and TPU_NAME from;
            None: the process environment.
        gpus: GPU names to plan for; None: the GPUs TensorFlow sees.
        tpu: a TPU name or address; False for none; None: detected from TPU_NAME,
            COLAB_TPU_ADDR or a local TPU device.

    Returns:
        A `StrategyPlan`.
    """
    choice("kind", kind, KINDS)
    env = os.environ if environ is None else environ
    cluster = _cluster_info(tf_config, cluster_resolver, env)
    gpu_names = tuple(local_gpus() if gpus is None else gpus)
    tpu_address = _detect_tpu(env) if tpu is None else (tpu or None)
    if tpu_address is True:
        tpu_address = ""
    chosen, reason = (
        _choose_kind(cluster, gpu_names, tpu_address)
        if kind == "auto"
        else (kind, f'kind="{kind}" was asked for')
    )
    _check_requirements(chosen, cluster, tpu_address)
    chosen_devices = _devices_for(chosen, devices, gpu_names)
    return StrategyPlan(chosen, reason, chosen_devices, cluster, tpu_address)


def select_strategy(
    kind: str = "auto",
    *,
    devices: Sequence[str] | None = None,
    tf_config: str | Mapping[str, Any] | None = None,
    cluster_resolver: Any = None,
    environ: Mapping[str, str] | None = None,
    gpus: Sequence[str] | None = None,
    tpu: str | bool | None = None,
    cross_device_ops: Any = None,
    communication: str = "auto",
) -> Any:
    """Pick the right `tf.distribute.Strategy` and create it.

    "auto" checks, in order: a reachable TPU -> "tpu"; a cluster with ps tasks ->
    "parameter_server"; a cluster with more than one worker (TF_CONFIG, or Slurm with more than
    one task) -> "multi_worker"; more than one GPU -> "mirrored"; one GPU -> "one_device" on it;
    CPU split by `simulate_devices(n)` with n > 1 -> "mirrored" over those; otherwise "default".
    `describe_strategy()` on the result tells which signal decided.

    Args:
        kind: as in `plan_strategy`.
        devices: as in `plan_strategy`.
        tf_config: as in `plan_strategy`.
        cluster_resolver: as in `plan_strategy`.
        environ: as in `plan_strategy`.
        gpus: as in `plan_strategy`.
        tpu: as in `plan_strategy`.
        cross_device_ops: for "mirrored": "nccl", "hierarchical_copy", "reduce_to_one_device",
            a `tf.distribute.CrossDeviceOps` object, or None for TensorFlow's choice.
        communication: for "multi_worker": "auto", "ring" or "nccl".

    Returns:
        The strategy; use it as `with strategy.scope(): ...`.
    """
    if isinstance(cross_device_ops, str):  # or None (TensorFlow's choice), or a CrossDeviceOps object
        choice("cross_device_ops", cross_device_ops, CROSS_DEVICE_OPS)
    if communication is not None:
        choice("communication", communication, COMMUNICATIONS)
    plan = plan_strategy(kind, devices=devices, tf_config=tf_config, cluster_resolver=cluster_resolver,
                         environ=environ, gpus=gpus, tpu=tpu)
    _check_devices_exist(plan.devices)
    key = _reuse_key(plan, cross_device_ops, communication, cluster_resolver)
    if key in _CREATED:
        remember_plan(_CREATED[key], plan)  # the same strategy, described by this request's reason
        return _CREATED[key]
    strategy = _build(plan, cross_device_ops, communication, cluster_resolver)
    if plan.kind == "multi_worker":
        _join_cluster(strategy, plan.cluster)
    remember_plan(strategy, plan)  # its context is decided anew from this plan (the default strategy is reused)
    if key is not None:
        _CREATED[key] = strategy
    return strategy


# Strategies already made in this process, by request. Two MirroredStrategy objects over the same
# devices reuse TensorFlow's collective instance keys, so training a second model under the second
# one fails ("Shape mismatch in the collective instance 100"; tests/python/test_strategy.py pins
# it); a multi-worker strategy can be made only once per process anyway.
_CREATED: dict[tuple[Any, ...], Any] = {}


def _reuse_key(plan: StrategyPlan, cross_device_ops: Any, communication: str,
               cluster_resolver: Any) -> tuple[Any, ...] | None:
    if cluster_resolver is not None or not (cross_device_ops is None or isinstance(cross_device_ops, str)):
        return None  # objects of the caller's: a new strategy each time, as asked
    cluster = json.dumps(plan.cluster.cluster, sort_keys=True)
    return (plan.kind, plan.devices, plan.tpu, cluster, plan.cluster.task_type, plan.cluster.task_index,
            cross_device_ops, communication)


def describe_strategy(strategy: Any = None) -> StrategyDescription:
    """Describe a strategy: kind, the signal that chose it, replicas, devices, workers, chief.

    Args:
        strategy: a strategy from `select_strategy` or any `tf.distribute.Strategy`; None: the
            strategy whose scope is active (the default strategy outside any scope).
    """
    context = context_of(strategy)
    plan = plan_of(context.strategy)
    return StrategyDescription(
        kind=context.kind,
        reason=plan.reason if plan else "created outside kerasdist",
        num_replicas=context.num_replicas,
        devices=_worker_devices(context.strategy),
        workers=context.num_workers,
        task=context.task,
        is_chief=context.is_chief,
    )


def simulate_devices(n: int) -> list[str]:
    """Split the CPU into `n` logical devices so mirrored code runs on one machine.

    Must run before TensorFlow initializes its devices (before any op, model or strategy; from R
    before any keras3 function runs: `library(keras3)` first is fine). Calling it again with the
    same `n` is a no-op.

    Returns:
        The names of the logical CPU devices.
    """
    import tensorflow as tf

    n = integer("n", n, 1, hint="the number of CPU devices")
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu) or []
    if len(current) != n:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
            )
        except RuntimeError:
            raise RuntimeError(
                f"simulate_devices({n}) came too late: TensorFlow has already initialized its "
                f"devices ({len(tf.config.list_logical_devices('CPU'))} CPU device(s)). Call it "
                "first, before any model, op or strategy is created (from R: before any keras3 "
                "function runs; library(keras3) first is fine)."
            ) from None
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def apply_requested_devices() -> None:
    """Split the CPU as R's simulate_devices() asked before this import, then forget the request
    (so processes started later do not inherit it)."""
    requested = os.environ.pop(DEVICES_VARIABLE, None)
    if requested:
        try:
            simulate_devices(int(requested))
        except (ValueError, RuntimeError):
            pass  # the caller's own simulate_devices() call reports it


def _choose_kind(
    cluster: ClusterInfo, gpus: Sequence[str], tpu: str | None
) -> tuple[str, str]:
    """The "auto" rules, first match wins."""
    if tpu is not None:
        return "tpu", f"a TPU is reachable ({tpu if tpu not in (None, '', 'local') else 'local TPU device'})"
    if cluster.num_ps > 0:
        return "parameter_server", (
            f"{cluster.source} declares {cluster.num_ps} ps task(s) and "
            f"{cluster.num_workers} worker(s)"
        )
    if cluster.num_workers > 1:
        return "multi_worker", f"{cluster.source} declares {cluster.num_workers} workers"
    if len(gpus) > 1:
        return "mirrored", f"{len(gpus)} GPUs are visible"
    if len(gpus) == 1:
        return "one_device", f"one GPU is visible ({gpus[0]})"
    simulated = _simulated_cpu_count()
    if simulated > 1:
        return "mirrored", f"no GPU; the CPU is split into {simulated} logical devices"
    return "default", "no TPU, cluster or GPU found: one process on the CPU"


def _check_requirements(kind: str, cluster: ClusterInfo, tpu: str | None) -> None:
    if kind == "tpu" and tpu is None:
        raise ValueError(
            'kind="tpu" but no TPU is reachable: set TPU_NAME, pass tpu="name-or-grpc-address", '
            "or run on a TPU VM."
        )
    if kind == "parameter_server" and cluster.num_ps == 0:
        raise ValueError(
            'kind="parameter_server" needs a cluster with "ps" tasks (TF_CONFIG, tf_config or '
            "cluster_resolver); none was found."
        )


def _cluster_info(
    tf_config: str | Mapping[str, Any] | None, resolver: Any, env: Mapping[str, str]
) -> ClusterInfo:
    if resolver is not None:
        return cluster_of_resolver(resolver)
    if tf_config is not None:
        return parse_tf_config(tf_config)
    return cluster_from_environment(env)


def _devices_for(kind: str, devices: Sequence[str] | None, gpus: Sequence[str]) -> tuple[str, ...]:
    if devices is not None:
        if isinstance(devices, str):
            devices = [devices]
        if kind not in ("one_device", "mirrored"):
            raise ValueError(
                f'devices can only be given for kind "one_device" or "mirrored", not "{kind}".'
            )
        if kind == "one_device" and len(devices) != 1:
            raise ValueError(f'kind="one_device" takes exactly one device, got {len(devices)}.')
        if not devices:
            raise ValueError("devices must name at least one device, got an empty list.")
        return tuple(devices)
    if kind == "one_device":
        return (_short_name(gpus[0]) if gpus else "/cpu:0",)
    if kind == "mirrored" and gpus:
        return tuple(_short_name(g) for g in gpus)
    return ()


def _check_devices_exist(devices: Sequence[str]) -> None:
    if not devices:
        return
    import tensorflow as tf

    available = {_device_key(d.name) for d in tf.config.list_logical_devices()}
    for device in devices:
        if _device_key(device) not in available:
            names = ", ".join(sorted(_short_name(d.name) for d in tf.config.list_logical_devices()))
            raise ValueError(
                f"devices: {device!r} does not exist on this machine. Available: {names}."
            )


def _device_key(name: str) -> tuple[str, int]:
    import tensorflow as tf

    try:  # physical device names ("/physical_device:GPU:0") parse once renamed
        spec = tf.DeviceSpec.from_string(name.replace("/physical_device:", "/device:", 1))
    except ValueError:
        raise ValueError(f"devices: {name!r} is not a device name like '/gpu:0' or '/cpu:1'.") from None
    return (spec.device_type or "").upper(), spec.device_index or 0


def _short_name(name: str) -> str:
    device_type, index = _device_key(name)
    return f"/{device_type.lower()}:{index}"


def local_gpus() -> list[str]:
    """The names of the GPUs TensorFlow sees on this machine (what "auto" plans for)."""
    import tensorflow as tf

    return [d.name for d in tf.config.list_physical_devices("GPU")]


def _simulated_cpu_count() -> int:
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    return len(tf.config.get_logical_device_configuration(cpus[0]) or []) if cpus else 0


def _detect_tpu(env: Mapping[str, str]) -> str | None:
    for name in TPU_ENV_VARS:
        if env.get(name):
            return env[name]
    if env.get(TPU_VM_ENV_VAR) or os.path.exists("/dev/accel0"):
        return "local"
    return None


def _worker_devices(strategy: Any) -> tuple[str, ...]:
    try:
        return tuple(_short_name(d) for d in strategy.extended.worker_devices)
    except (AttributeError, NotImplementedError, RuntimeError, ValueError):
        return ()


def _build(plan: StrategyPlan, cross_device_ops: Any, communication: str, resolver: Any) -> Any:
    import tensorflow as tf

    if plan.kind == "default":
        return tf.distribute.get_strategy()
    if plan.kind == "one_device":
        return tf.distribute.OneDeviceStrategy(plan.devices[0])
    if plan.kind == "mirrored":
        return tf.distribute.MirroredStrategy(
            devices=list(plan.devices) or None,
            cross_device_ops=_cross_device_ops(cross_device_ops),
        )
    if plan.kind == "multi_worker":  # too late, it raises compat.MultiWorkerStrategyTooLate
        resolver = _resolver_for(plan, resolver) or tf.distribute.cluster_resolver.TFConfigClusterResolver()
        from kerasdist.compat import configure_coordination

        configure_coordination(resolver.cluster_spec(), peer_timeout_seconds())
        with forming_cluster():  # a supervised restart's wait for its peers is bounded (launch/supervisor.py)
            return tf.distribute.MultiWorkerMirroredStrategy(
                cluster_resolver=resolver,
                communication_options=_communication_options(communication),
            )
    if plan.kind == "parameter_server":
        return tf.distribute.ParameterServerStrategy(_resolver_for(plan, resolver))
    return _build_tpu(plan.tpu)


PEER_TIMEOUT_VARIABLE = "KERASDIST_PEER_TIMEOUT"
DEFAULT_PEER_TIMEOUT = 2.0


def peer_timeout_seconds(environ: Mapping[str, str] | None = None) -> float:
    """How long a multi-worker cluster waits for a silent worker before declaring it lost (its
    process killed, its host down): `$KERASDIST_PEER_TIMEOUT` seconds, default 2. TensorFlow's
    coordination service then ends the collectives the others wait in, and each exits 76. The
    workers' heartbeats come from a thread of their own, so a step or a save longer than this is
    not a lost peer; raise it for networks that can go quiet that long (e.g. 10, TensorFlow's
    default)."""
    text = (os.environ if environ is None else environ).get(PEER_TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_PEER_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0.5 <= seconds <= 3600:
        raise ValueError(f"{PEER_TIMEOUT_VARIABLE} must be a number of seconds between 0.5 and 3600 (how long a "
                         f"silent worker is waited for before it counts as lost), got {text!r}.")
    return seconds


def _resolver_for(plan: StrategyPlan, resolver: Any) -> Any:
    import tensorflow as tf

    if resolver is not None:
        return resolver
    if plan.cluster.source == "Slurm":
        from kerasdist.compat import slurm_resolver

        return slurm_resolver(plan.cluster, local_gpus())
    if plan.cluster.source == "TF_CONFIG":
        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(plan.cluster.cluster),
            task_type=plan.cluster.task_type,
            task_id=plan.cluster.task_index,
            rpc_layer="grpc",
        )
    return None  # no cluster: a single local worker


def _join_cluster(strategy: Any, cluster: ClusterInfo) -> None:
    """Right after the cluster formed: check every worker was given the same cluster, and stop
    every worker alike (75) if any was signalled while it formed or while they agree
    (`preemption.signals.ClusterStartHold`). Each worker reads TensorFlow's preemption notice on
    its own, and the signalled worker's notice may reach the store between two workers' reads, so
    they decide on what any of them read (a worker that exited alone left the other failing in its
    first collective with 1). The gather that decides ends at different moments on different
    workers, so they meet at a barrier before any exits: a worker that left at once closed the
    connections the other's gather still used ("Socket closed", exit 1); a signal recorded after
    a worker's vote exits it alone, and the others then lose it as a peer (76). A lost peer from
    here on ends the process with 76 (`exit_when_peer_lost`)."""
    from kerasdist.preemption.agreement import meet_every_worker
    from kerasdist.preemption.exit import exit_on_lost_peer, exit_when_peer_lost, peer_lost
    from kerasdist.preemption.signals import ClusterStartHold

    task = f"{cluster.task_type}:{cluster.task_index}"
    with ClusterStartHold() as hold:  # SIGTERM is given back even when the cluster check fails
        noticed = hold.noticed()
        if cluster.num_workers == 1:
            hold.any_noticed = noticed
            return
        exit_when_peer_lost(cluster.num_workers, task)
        with exit_on_lost_peer(cluster.num_workers, task):
            try:
                hold.any_noticed = _check_cluster_agreement(strategy, cluster, noticed)
            except Exception as err:  # a peer that read this worker's notice and left: stop alike
                if not (noticed and peer_lost(err, cluster.num_workers, task)):
                    raise
                hold.any_noticed = True
        meet_every_worker("kerasdist-cluster-agreed")


def _check_cluster_agreement(strategy: Any, cluster: ClusterInfo, noticed: bool) -> bool:
    """Every worker must have been given the same cluster: gather a fingerprint of each one's,
    with whether it `noticed` a preemption; returns whether any worker did."""
    import hashlib
    import json

    import tensorflow as tf

    text = json.dumps(cluster.cluster, sort_keys=True)
    fingerprint = int(hashlib.sha256(text.encode()).hexdigest()[:7], 16)
    mine = strategy.experimental_distribute_values_from_function(
        lambda _: tf.constant([fingerprint, int(noticed)], dtype=tf.int32)
    )
    everyone = strategy.gather(mine, axis=0).numpy().reshape(-1, 2)
    if len(set(everyone[:, 0].tolist())) > 1:
        raise ValueError(
            f"TF_CONFIG disagrees between processes: the {cluster.task_type} {cluster.task_index} "
            f"was given the cluster {text}, and some other worker a different one. Give every "
            "process the same \"cluster\" (only \"task\" differs)."
        )
    return bool(everyone[:, 1].any())


def _cross_device_ops(value: Any) -> Any:
    import tensorflow as tf

    factories = {
        "nccl": tf.distribute.NcclAllReduce,
        "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
        "reduce_to_one_device": tf.distribute.ReductionToOneDevice,
    }
    return factories[value]() if isinstance(value, str) else value


def _communication_options(value: str) -> Any:
    import tensorflow as tf

    implementation = getattr(tf.distribute.experimental.CommunicationImplementation, value.upper())
    return tf.distribute.experimental.CommunicationOptions(implementation=implementation)


def _build_tpu(tpu: str | None) -> Any:
    import tensorflow as tf

    address = "" if tpu in (None, "local") else tpu
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)
