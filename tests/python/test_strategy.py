"""Strategies built for real on this CPU, and the errors that need a live TensorFlow."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import kerasdist
from conftest import run_python


def test_default_strategy_describes_itself():
    description = kerasdist.describe_strategy(kerasdist.select_strategy("default", environ={}, tpu=False))
    assert description.kind == "default"
    assert description.num_replicas == 1
    assert description.is_chief and description.workers == 1
    assert "strategy:  default" in str(description)


def test_run_context_is_public_and_follows_the_active_scope():
    strategy = kerasdist.select_strategy("one_device", environ={}, gpus=[], tpu=False)
    with strategy.scope():
        inside = kerasdist.run_context()
    assert isinstance(inside, kerasdist.RunContext)
    assert (inside.strategy, inside.kind, inside.num_replicas) == (strategy, "one_device", 1)
    assert (inside.num_workers, inside.task, inside.is_chief) == (1, None, True)
    assert kerasdist.run_context().kind == "default"


def test_select_strategy_names_an_unknown_signal():
    with pytest.raises(TypeError, match="select_strategy\\(\\) got an unexpected keyword argument .device."):
        kerasdist.select_strategy("default", device="/cpu:0")


def test_one_device_on_cpu():
    strategy = kerasdist.select_strategy("one_device", environ={}, gpus=[], tpu=False)
    assert isinstance(strategy, tf.distribute.OneDeviceStrategy)
    assert kerasdist.describe_strategy(strategy).devices == ("/cpu:0",)


def test_mirrored_with_named_cross_device_ops():
    strategy = kerasdist.select_strategy(
        "mirrored", devices=["/cpu:0"], cross_device_ops="reduce_to_one_device", environ={}, tpu=False
    )
    assert isinstance(strategy.extended._cross_device_ops, tf.distribute.ReductionToOneDevice)
    description = kerasdist.describe_strategy(strategy)
    assert (description.kind, description.num_replicas) == ("mirrored", 1)
    assert "was asked for" in description.reason


def test_describe_strategy_created_outside_kerasdist():
    description = kerasdist.describe_strategy(tf.distribute.OneDeviceStrategy("/cpu:0"))
    assert description.kind == "one_device"
    assert description.reason == "created outside kerasdist"


def test_describe_active_strategy_inside_scope():
    strategy = kerasdist.select_strategy("one_device", environ={}, gpus=[], tpu=False)
    with strategy.scope():
        assert kerasdist.describe_strategy().kind == "one_device"
    assert kerasdist.describe_strategy().kind == "default"


def test_describe_strategy_rejects_non_strategy():
    with pytest.raises(ValueError, match="strategy must be a tf.distribute.Strategy, got str"):
        kerasdist.describe_strategy("mirrored")


def test_simulated_devices_give_mirrored_and_a_real_fit():
    result = run_python(
        """
        import json, numpy as np, keras, kerasdist
        names = kerasdist.simulate_devices(2)
        assert kerasdist.simulate_devices(2) == names  # same n again: a no-op
        strategy = kerasdist.select_strategy()
        with strategy.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
        x = np.arange(48, dtype="float32").reshape(16, 3) / 48
        history = model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0)
        d = kerasdist.describe_strategy(strategy)
        print(json.dumps({"names": names, "kind": d.kind, "reason": d.reason,
                          "replicas": d.num_replicas, "devices": list(d.devices),
                          "steps": int(model.optimizer.iterations.numpy()),
                          "loss": history.history["loss"][0]}))
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(out["names"]) == 2
    assert (out["kind"], out["replicas"]) == ("mirrored", 2)
    assert "split into 2 logical devices" in out["reason"]
    assert out["devices"] == ["/cpu:0", "/cpu:1"]
    assert out["steps"] == 2 and np.isfinite(out["loss"])


def test_simulate_devices_after_initialization_is_a_clear_error():
    result = run_python(
        """
        import tensorflow as tf, kerasdist
        tf.constant(1.0) + 1  # initializes the devices
        try:
            kerasdist.simulate_devices(2)
        except RuntimeError as err:
            print("ERROR:", err)
        """
    )
    assert "ERROR: simulate_devices(2) came too late" in result.stdout, result.stderr[-2000:]


def test_multi_worker_on_a_one_worker_cluster_on_localhost():
    port = _free_port()
    tf_config = {"cluster": {"worker": [f"127.0.0.1:{port}"]}, "task": {"type": "worker", "index": 0}}
    result = run_python(
        """
        import json, sys, kerasdist, tensorflow as tf
        strategy = kerasdist.select_strategy(
            "multi_worker", environ={"TF_CONFIG": sys.argv[1]}, gpus=[], tpu=False
        )
        print(isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy))
        d = kerasdist.describe_strategy(strategy)
        print(json.dumps({"kind": d.kind, "task": d.task, "chief": d.is_chief, "workers": d.workers}))
        """,
        json.dumps(tf_config),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-2] == "True"
    assert json.loads(lines[-1]) == {"kind": "multi_worker", "task": "worker:0", "chief": True, "workers": 1}


def test_cli_info_names_strategy_and_reason():
    result = subprocess.run(
        [sys.executable, "-m", "kerasdist", "info", "--devices", "2"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "strategy:  mirrored" in result.stdout
    assert "why:       no GPU; the CPU is split into 2 logical devices" in result.stdout


def test_cli_reports_bad_input_without_traceback():
    result = subprocess.run(
        [sys.executable, "-m", "kerasdist", "info", "--kind", "tpu"], capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 2
    assert "kerasdist: error: kind=\"tpu\" but no TPU is reachable" in result.stderr
    assert "Traceback" not in result.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_upstream_slurm_resolver_still_fails_on_cpu_only_nodes(monkeypatch):
    """Fails once TensorFlow's SlurmClusterResolver works without GPUs; then kerasdist can use it
    on CPU nodes too instead of cluster.slurm_cluster + SimpleClusterResolver."""
    for name, value in {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "n[1-2]",
                        "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}.items():
        monkeypatch.setenv(name, value)
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(gpus_per_node=0, auto_set_gpu=False)
    with pytest.raises(ValueError, match="must not be zero"):
        resolver.cluster_spec()


def test_slurm_cpu_cluster_builds_a_resolver_with_slurm_layout():
    from kerasdist.strategy import _resolver_for

    env = {"SLURM_JOB_ID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1",
           "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
    plan = kerasdist.plan_strategy(environ=env, gpus=[], tpu=False)
    resolver = _resolver_for(plan, None)
    assert resolver.cluster_spec().as_dict() == {"worker": ["n1:8888", "n2:8888"]}
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)


def test_slurm_gpu_share_is_this_tasks_gpus_and_leaves_cuda_visible_devices_alone(monkeypatch):
    """Two tasks on a 4-GPU node: task 1 gets GPUs 2 and 3. TensorFlow's resolver writes them to
    CUDA_VISIBLE_DEVICES after kerasdist listed the GPUs (too late to count), so kerasdist reads
    the share back and applies it with tf.config.set_visible_devices."""
    from kerasdist.compat import slurm_gpu_share

    for name, value in {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "n1",
                        "SLURM_STEP_TASKS_PER_NODE": "2"}.items():
        monkeypatch.setenv(name, value)
    # Set first so that monkeypatch restores its absence: the resolver's own cluster_spec() below
    # writes it, and it must not leak into the tests after this one.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(gpus_per_node=4)
    assert slurm_gpu_share(resolver) == [2, 3]
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert resolver.cluster_spec().as_dict() == {"worker": ["n1:8888", "n1:8889"]}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6,7,8")  # set by Slurm for the step
    assert slurm_gpu_share(tf.distribute.cluster_resolver.SlurmClusterResolver(gpus_per_node=4)) == [2, 3]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5,6,7,8"


TWO_STRATEGIES = """
import sys, keras, numpy as np, tensorflow as tf, kerasdist
kerasdist.simulate_devices(2)
def make():
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if sys.argv[1] == "tf" else kerasdist.select_strategy()
def fit(strategy, width):
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(width), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
    model.fit(np.zeros((32, 4), "float32"), np.zeros((32, 1), "float32"), batch_size=8, verbose=0)
first = make(); fit(first, 8)
second = make(); fit(second, 64)
print("same strategy" if first is second else "two strategies", "trained")
"""


def test_select_strategy_reuses_its_mirrored_strategy_because_two_collide_upstream():
    """Fails once TensorFlow keeps two MirroredStrategy objects' collectives apart; then
    select_strategy can stop reusing the one it made."""
    upstream = run_python(TWO_STRATEGIES, "tf")
    assert upstream.returncode != 0 and "Shape mismatch in the collective instance" in upstream.stderr
    ours = run_python(TWO_STRATEGIES, "kerasdist")
    assert ours.returncode == 0, ours.stderr[-2000:]
    assert ours.stdout.strip() == "same strategy trained"


def test_run_context_is_decided_once_per_strategy_and_passed_through():
    from kerasdist.context import RunContext, context_of, run_context

    strategy = kerasdist.select_strategy("default", environ={}, tpu=False)
    context = run_context(strategy)
    assert isinstance(context, RunContext) and context.strategy is strategy
    assert (context.kind, context.num_replicas, context.num_workers) == ("default", 1, 1)
    assert (context.task, context.is_chief, context.is_parameter_server) == (None, True, False)
    assert run_context(strategy) is context and run_context(context) is context
    assert context_of() is context  # kerasdist's own calls, outside any scope: the default strategy's
    assert run_context() == context  # users' outside any scope: its place in the (here absent) cluster
    with pytest.raises(ValueError, match="strategy must be a tf.distribute.Strategy, got str"):
        run_context("mirrored")


def test_only_the_run_context_asks_tensorflow_for_the_active_strategy():
    """context.py (context_of) asks; strategy.py only to build kind="default"."""
    from pathlib import Path

    package = Path(kerasdist.__file__).parent
    askers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py") if "get_strategy()" in p.read_text())
    assert askers == ["context.py", "strategy.py"]
