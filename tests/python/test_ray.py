"""kerasdist on Ray Train: examples/ray/train.py and train.R, unchanged, on real Ray clusters in
network namespaces this test makes (tools/ray_cluster.py).

One node, bound to 127.0.0.1 in a namespace whose only interface is loopback: an uninterrupted run
(the reference), and a run whose worker 1 is SIGKILLed mid-epoch 2 (Ray restarts the worker
group), then whose driver is SIGKILLed mid-epoch 3 and a new driver, in R (train.R), resumes it
with the same RunConfig(name, storage_path): Ray Train V2's restore (2.60's
`TensorflowTrainer.restore` only raises a DeprecationWarning). Two nodes on a bridge of
their own (1 CPU each): a run whose second node is lost mid-epoch (every process on it stopped,
then SIGKILLed) and replaced, its storage_path an S3 bucket (SeaweedFS on the head's address), and
an elastic run (`--workers 1-2`) that goes on with one worker when that node is lost. Every run
ends with each worker's weights bitwise equal to the reference (the elastic one within TOL: one
worker sums each batch's gradients in another order), Ray's result holding the last epoch's
metrics and kerasdist's newest checkpoint, not a copy of it.

The runs are made once a session (`made_once`: the tests that read them may run in either pytest
worker) and one cluster at a time; the tests check what they left. Needs root and Ray (skipped
otherwise, unless CI=true, where they must run).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

import kerasdist
from conftest import run_python
from kerasdist_testing.s3_test_server import S3TestServer, weed_binary

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import ray_cluster  # noqa: E402
from ray_chaos import EVERY_STEPS, PACE, ExampleRun, cluster_env, listening_snapshot  # noqa: E402

EPOCHS, STEPS_PER_EPOCH = 3, 10
STEPS = EPOCHS * STEPS_PER_EPOCH
FAIL_AFTER_STEP = 12  # mid-epoch 2, two steps after the newest checkpoint (step 10)
DRIVER_KILLED_AFTER_STEP = 22  # mid-epoch 3, after the restart the worker's SIGKILL caused
TOL = STEPS * float(np.finfo(np.float32).eps)  # as tests/python/test_reliability.py
ELASTIC_PLACEMENT_WAIT = 10  # seconds (RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S): placing what exists takes ms
BUCKET = "ray"
RAY_FILES = {"checkpoint_manager_snapshot.json", ".validate_storage_marker"}  # Ray's own, beside kerasdist/


def require_ray_cluster():
    reason = ray_cluster.missing_requirements()
    if reason:
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)(reason)


# -- the runs, made once ---------------------------------------------------------------------------
def one_node_runs(folder: Path) -> Path:
    runs = {}
    # 3 logical CPUs: the 2 workers', and the one a Tune trial (the reference's driver) holds
    with ray_cluster.RayCluster(1, cpus=(3,), env=cluster_env()) as cluster:
        reference = ExampleRun(cluster, folder, "reference", "--tune")
        reference.start()
        runs["reference"] = reference.finish()

        failed = ExampleRun(cluster, folder, "worker-then-driver-killed")
        failed.start()
        failed.wait_step(3)
        failed.result["sockets"] = listening_snapshot(cluster)
        failed.wait_step(FAIL_AFTER_STEP)
        lines = len(failed.log(0))
        os.kill(failed.pid(1), signal.SIGKILL)
        failed.result["stopwatch"] = failed.stopwatch_to_first_resumed_step(lines)
        failed.wait_step(DRIVER_KILLED_AFTER_STEP)
        failed.driver.send_signal(signal.SIGKILL)  # nsenter execs: the driver's own pid
        failed.driver.wait(timeout=30)
        failed.start("R")
        runs["failed"] = failed.finish()
    (folder / "runs.json").write_text(json.dumps(runs))
    return folder / "runs.json"


def two_node_runs(folder: Path, one_node: Path) -> Path:
    """The node-lost run keeps Ray's storage (and so kerasdist's checkpoints) in S3: a SeaweedFS
    server in the head's namespace, on its address, which both nodes reach and nothing else does."""
    del one_node  # made first: one Ray cluster at a time on this machine
    runs, servers = {}, []

    def start_s3(cluster: ray_cluster.RayCluster) -> dict[str, str]:
        data = cluster.root / "s3"
        data.mkdir()
        server = S3TestServer(weed_binary(), data, host=cluster.node_ip(0),
                              netns=str(ray_cluster.NETNS_DIR / cluster.namespace(0)))
        servers.append(server)
        server.make_bucket(BUCKET)
        return server.environment()  # every Ray process's: s3fs and pyarrow read them

    cluster = ray_cluster.RayCluster(2, cpus=(1, 1), env=cluster_env(), prepare=start_s3)
    with cluster, contextlib.ExitStack() as stop:
        stop.callback(lambda: [server.stop() for server in servers])
        lost = ExampleRun(cluster, folder, "node-lost", storage=f"s3://{BUCKET}/ray")
        lost.start()
        lost.wait_step(3)
        lost.result["sockets"] = listening_snapshot(cluster)
        lost.wait_step(FAIL_AFTER_STEP)
        lines = len(lost.log(0))
        cluster.kill_node(1)
        cluster.start_node(1)  # its replacement, as KubeRay starts a new pod
        lost.result["stopwatch"] = lost.stopwatch_to_first_resumed_step(lines)
        runs["node_lost"] = lost.finish()

        elastic = ExampleRun(cluster, folder, "elastic", "--workers", "1-2")
        # Ray places the group's old size again while it still counts the lost node (until its health
        # check declares the node dead), waiting this long (60 s by default) for each placement
        elastic.start(env={"RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": str(ELASTIC_PLACEMENT_WAIT)})
        elastic.wait_step(FAIL_AFTER_STEP)
        lines = len(elastic.log(0))
        cluster.kill_node(1)
        elastic.result["stopwatch"] = elastic.stopwatch_to_first_resumed_step(lines)
        runs["elastic"] = elastic.finish()
    (folder / "runs.json").write_text(json.dumps(runs))
    return folder / "runs.json"


@pytest.fixture(scope="module")
def one_node(made_once) -> dict:
    require_ray_cluster()
    return json.loads(made_once("ray-one-node", one_node_runs).read_text())


@pytest.fixture(scope="module")
def two_nodes(made_once) -> dict:
    require_ray_cluster()
    first = made_once("ray-one-node", one_node_runs)
    return json.loads(made_once("ray-two-nodes", lambda folder: two_node_runs(folder, first)).read_text())


# -- checks ----------------------------------------------------------------------------------------
def weights(run: dict, rank: int) -> list[np.ndarray]:
    with np.load(Path(run["out"]) / f"weights-rank{rank}.npz") as saved:
        return [saved[name] for name in saved.files]


def assert_completed(run: dict) -> None:
    assert run["returncode"] == 0, run["driver_output"]
    assert run["chief_log"][-1].startswith("done"), run["chief_log"][-5:]


def assert_equal_to(run: dict, reference: dict, ranks=(0, 1)) -> None:
    for rank in ranks:
        for a, b in zip(weights(run, rank), weights(reference, 0), strict=True):
            np.testing.assert_array_equal(a, b)


def assert_reported(run: dict, reference: dict) -> None:
    """Ray's result: the last epoch's metrics (the reference's loss, bit for bit) and kerasdist's
    newest checkpoint itself; the run's directory holds nothing else of size (no copy)."""
    metrics, expected = json.loads(run["metrics"]), json.loads(reference["metrics"])
    assert metrics == expected and metrics["epoch"] == EPOCHS
    assert run["checkpoint"] == run["latest"] and run["checkpoint"].endswith(f"/kerasdist/ckpt-{STEPS}")
    assert set(run["run_dir_entries"]) == {"kerasdist"} | RAY_FILES, run["run_dir_entries"]


def steps_after_restarts(run: dict) -> list[list[int]]:
    """The chief's steps, one list per process (a "pid" line starts one)."""
    attempts: list[list[int]] = []
    for line in run["chief_log"]:
        if line.startswith("pid "):
            attempts.append([])
        elif line.startswith("step "):
            attempts[-1].append(int(line.split()[1]))
    return attempts


def assert_resumed_at_next_unseen_batch(run: dict) -> None:
    """Each later process starts at the step after the checkpoint it restored (goodput's attempts
    say which), and the last one goes on to the end."""
    attempts = steps_after_restarts(run)
    logged = run["attempts"]
    assert len(attempts) == len(logged) >= 2, (attempts, logged)
    for steps, before, attempt in zip(attempts[1:], logged, logged[1:], strict=False):
        restored = attempt["restored_step"]
        assert restored % EVERY_STEPS == 0 and 0 < restored <= before["last_step"], (before, attempt)
        assert steps[0] == restored + 1, (steps, attempt)
        assert steps == list(range(steps[0], steps[0] + len(steps)))
    assert attempts[-1][-1] == STEPS


def assert_recovery_agrees(run: dict, attempt: int = -1) -> None:
    """The outside stopwatch (failure to the first resumed step in the chief's log) and kerasdist's
    goodput (failure: the chief's last completed step) tell the same recovery."""
    recovery = run["attempts"][attempt]["recovery"]
    assert recovery is not None
    # goodput counts from the last step the chief completed, at most one step (PACE) before the kill
    assert -1.0 <= recovery["total"] - run["stopwatch"] <= PACE + 1.0, (recovery, run["stopwatch"])


def test_import_kerasdist_never_imports_ray():
    done = run_python("""
        import sys, kerasdist
        assert kerasdist.ray_train.ray_train_module() is None
        print(sorted(m for m in sys.modules if m == "ray" or m.startswith("ray.")))
    """)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]


def test_ray_2_60_restores_a_run_by_its_run_config_and_its_driver_is_not_a_worker():
    """Canary (docs/ray.md): Ray Train V2's `TensorflowTrainer.restore` only raises; a run is
    restored by its RunConfig(name, storage_path). A process that imported Ray Train without running
    its training function (a driver) is not reported from."""
    done = run_python("""
        import ray.train
        import kerasdist
        from ray.train.tensorflow import TensorflowTrainer
        assert kerasdist.ray_train.ray_train_module() is None
        try:
            TensorflowTrainer.restore("/nowhere")
        except DeprecationWarning as warning:
            print("DeprecationWarning:", warning)
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "DeprecationWarning: The `restore` and `can_restore` APIs are deprecated" in done.stdout, done.stdout


def test_ray_checkpoint_dir_outside_ray_says_where_it_belongs():
    with pytest.raises(RuntimeError, match=r"call it inside the training function a Ray TensorflowTrainer runs"):
        kerasdist.ray_checkpoint_dir()
    with pytest.raises(ValueError, match=r"folder must be a plain folder name, got 'a/b'"):
        kerasdist.ray_checkpoint_dir("a/b")


def test_uninterrupted_run_reports_metrics_and_its_checkpoint_without_a_copy(one_node):
    """The reference runs as the one trial of a Ray Tune experiment: Tune gets what the trainer
    reported (the other runs' Ray results, compared with it, are the trainer's own)."""
    reference = one_node["reference"]
    assert_completed(reference)
    assert_reported(reference, reference)
    assert steps_after_restarts(reference) == [list(range(1, STEPS + 1))]
    # every epoch end's checkpoint was reported, so Ray holds them all (kerasdist's keep=2 spares
    # them); the mid-epoch ones are kerasdist's own and pruned as usual
    assert [Path(p).name for p in reference["checkpoints"]] == [f"ckpt-{s}" for s in (10, 20, 25, 30)]
    assert_equal_to(reference, reference, ranks=(1,))


def test_a_sigkilled_worker_then_a_killed_driver_each_resume_bitwise(one_node):
    """Worker 1 SIGKILLed: Ray restarts the worker group, which resumes. Then the driver SIGKILLed
    (its job, the controller and the workers end with it): a new driver, in R, with the same
    RunConfig resumes. Each at the next unseen batch; the end bitwise equal to the reference."""
    run = one_node["failed"]
    assert [d["kind"] for d in run["drivers"]] == ["python", "R"]
    assert_completed(run)
    assert len(run["attempts"]) == 3
    assert_resumed_at_next_unseen_batch(run)
    assert_equal_to(run, one_node["reference"])
    assert_recovery_agrees(run, attempt=1)
    loss = float(re.findall(rf"^metrics epoch {EPOCHS} loss (\S+)$", run["driver_output"], re.M)[-1])
    assert loss == json.loads(one_node["reference"]["metrics"])["loss"]  # Ray's result, as R sees it
    assert re.search(rf"^checkpoint \S+/kerasdist/ckpt-{STEPS} ?$", run["driver_output"], re.M), run["driver_output"]
    assert set(run["run_dir_entries"]) == {"kerasdist"} | RAY_FILES, run["run_dir_entries"]


def test_ray_listens_only_on_loopback_inside_its_namespace(one_node):
    sockets = one_node["failed"]["sockets"]
    assert_nothing_outside_the_namespaces(sockets)
    assert set(sockets["interfaces"]["0"]) == {"lo"}
    ray_daemons = [s for s in sockets["inside"]["0"] if s["process"] in ("gcs_server", "raylet")]
    assert ray_daemons and {s["address"] for s in ray_daemons} <= {"127.0.0.1", "::ffff:127.0.0.1"}, ray_daemons


def assert_nothing_outside_the_namespaces(sockets: dict) -> None:
    """Every process of the cluster runs in one of its namespaces, so none can listen on the
    machine's own interfaces; and none does."""
    assert sockets["process_namespaces"]
    assert set(sockets["process_namespaces"].values()) <= set(sockets["ours"].values()), sockets
    assert sockets["machine"] == []


def test_a_lost_node_replaced_resumes_bitwise(two_nodes, one_node):
    """Its storage is S3: Ray's checkpoint is kerasdist's checkpoint in the bucket (a path on
    Ray's S3 filesystem, bucket first)."""
    run = two_nodes["node_lost"]
    assert run["checkpoint"].startswith(f"{BUCKET}/ray/node-lost/kerasdist/"), run["checkpoint"]
    assert_completed(run)
    assert_resumed_at_next_unseen_batch(run)
    assert_equal_to(run, one_node["reference"])
    assert_reported(run, one_node["reference"])
    assert_recovery_agrees(run)


def test_two_nodes_listen_only_inside_their_namespaces(two_nodes):
    sockets = two_nodes["node_lost"]["sockets"]
    assert_nothing_outside_the_namespaces(sockets)
    for node, interfaces in sockets["interfaces"].items():
        assert len(interfaces) == 2 and "lo" in interfaces, interfaces  # loopback and the test bridge's veth
        (veth,) = set(interfaces) - {"lo"}
        own = interfaces[veth][0].split("/")[0]
        addresses = {s["address"] for s in sockets["inside"][node]}
        assert addresses <= {own, f"::ffff:{own}", "127.0.0.1", "::ffff:127.0.0.1", "*", "0.0.0.0", "::"}, addresses


def test_elastic_training_goes_on_with_fewer_workers(two_nodes, one_node):
    run = two_nodes["elastic"]
    assert_completed(run)
    assert_resumed_at_next_unseen_batch(run)
    assert run["attempts"][0]["workers"] == 2 and run["attempts"][-1]["workers"] == 1
    for a, b in zip(weights(run, 0), weights(one_node["reference"], 0), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=TOL)
