"""The local launcher, with real processes on 127.0.0.1 (tests/python/scripts/launch_probe.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kerasdist
from kerasdist.__main__ import main
from kerasdist.launch import launch

PROBE = str(Path(__file__).parent / "scripts" / "launch_probe.py")
R_TASK = Path(__file__).parents[1] / "testthat" / "scripts" / "launch_task.R"


def records(directory: Path, restart: int = 0) -> dict[str, dict]:
    """task ("worker 1") -> what that process recorded in the given attempt."""
    found = {}
    for path in sorted(directory.glob(f"{restart}-*.json")):
        record = json.loads(path.read_text())
        found[f"{record['task_type']} {record['task_index']}"] = record
    return found


def done(directory: Path, restart: int = 0) -> set[str]:
    return {p.stem.split("-", 1)[1].replace("-", " ") for p in directory.glob(f"{restart}-*.done")}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_each_process_gets_its_own_task_in_the_same_cluster(tmp_path, capsys):
    result = launch([PROBE, str(tmp_path)], num_workers=3, env={"PROBE_EXTRA": "x"}, cwd=tmp_path)

    assert (result.exit_code, result.restarts, result.failed) == (0, 0, None)
    assert result.ok and result.message == "all 3 workers finished."
    seen = records(tmp_path)
    assert sorted(seen) == ["worker 0", "worker 1", "worker 2"]
    clusters = [r["tf_config"]["cluster"] for r in seen.values()]
    assert all(c == result.cluster for c in clusters)
    assert list(result.cluster) == ["worker"]
    addresses = result.cluster["worker"]
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    assert len(set(addresses)) == 3
    for task, record in seen.items():
        assert record["tf_config"]["task"] == {"type": "worker", "index": record["task_index"]}
        assert task == f"worker {record['task_index']}" and record["restart"] == 0
        assert record["extra"] == "x" and Path(record["cwd"]) == tmp_path
    assert done(tmp_path) == {"worker 0", "worker 1", "worker 2"}


def test_output_lines_carry_the_role_and_index(tmp_path, capsys):
    launch([PROBE, str(tmp_path)], num_workers=2)

    out, err = capsys.readouterr()
    for i in (0, 1):
        assert f"[worker {i}] hello from worker {i} (restart 0)\n" in out
        assert f"[worker {i}] worker {i} done\n" in out
        assert f"[worker {i}] note on stderr from worker {i}\n" in err
    assert all(line.startswith("[worker ") for line in out.splitlines())
    assert "kerasdist launch: all 2 workers finished." in err


def test_parameter_servers_get_a_chief_and_are_stopped_when_it_finishes(tmp_path, capsys):
    start = time.monotonic()
    result = launch([PROBE, str(tmp_path), "--serve", "ps,worker", "--wait-all"],
                    num_workers=2, num_ps=1, grace_period=5)

    assert result.ok and result.message == "the chief finished."
    assert time.monotonic() - start < 60  # the servers serve forever unless stopped; 0.8 s in a loaded full run
    assert {k: len(v) for k, v in result.cluster.items()} == {"chief": 1, "worker": 2, "ps": 1}
    seen = records(tmp_path)
    assert sorted(seen) == ["chief 0", "ps 0", "worker 0", "worker 1"]
    assert seen["ps 0"]["tf_config"]["task"] == {"type": "ps", "index": 0}
    assert all(r["tf_config"]["cluster"] == result.cluster for r in seen.values())
    assert len({a for v in result.cluster.values() for a in v}) == 4
    assert not any(alive(r["pid"]) for r in seen.values())  # the servers were stopped
    assert done(tmp_path) == {"chief 0"}


@pytest.mark.parametrize(
    "how, description",
    [
        (["--exit", "3"], "worker 1 exited with status 3"),
        (["--signal", "KILL"], "worker 1 was killed by SIGKILL"),
        (["--exit", str(kerasdist.PREEMPTED_EXIT_CODE)],
         "worker 1 exited with status 75 (preempted, checkpoint saved)"),
    ],
    ids=["exit-3", "sigkill", "preempted-75"],
)
def test_a_failure_stops_and_restarts_the_whole_group(tmp_path, capsys, how, description):
    start = time.monotonic()
    result = launch([PROBE, str(tmp_path), "--fail", "worker 1", *how, "--sleep", "300"],
                    num_workers=2, max_restarts=2, grace_period=2)

    assert time.monotonic() - start < 90  # worker 0 (sleeping 300 s) was stopped, not waited for
    assert (result.exit_code, result.restarts) == (0, 1)
    assert [f.description for f in result.failures] == [description]
    failed = -signal.SIGKILL if "--signal" in how else int(how[1])
    assert result.exit_codes == ({"worker 0": -signal.SIGTERM, "worker 1": failed},
                                 {"worker 0": 0, "worker 1": 0})
    if failed == kerasdist.PREEMPTED_EXIT_CODE:  # the others got grace_period to stop on their own first
        assert time.monotonic() - start >= 2
    assert result.failures[0].restart == 0
    assert done(tmp_path, restart=0) == set()
    assert sorted(records(tmp_path, restart=1)) == ["worker 0", "worker 1"]
    assert done(tmp_path, restart=1) == {"worker 0", "worker 1"}
    assert not any(alive(r["pid"]) for r in records(tmp_path, restart=0).values())
    err = capsys.readouterr().err
    assert f"kerasdist launch: {description}; stopping the group." in err
    assert "kerasdist launch: restarting the group (1 of 2) on fresh ports." in err
    assert "kerasdist launch: all 2 workers finished after 1 restart." in err


def test_no_restarts_left_exits_non_zero_naming_the_process(tmp_path, capsys):
    result = launch([PROBE, str(tmp_path), "--fail", "worker 1", "--signal", "KILL",
                     "--sleep", "60"], num_workers=2, grace_period=5)

    assert result.exit_code == 128 + signal.SIGKILL
    assert result.failed is not None and result.failed.task == "worker 1"
    assert result.failed.returncode == -signal.SIGKILL
    assert result.message == "worker 1 was killed by SIGKILL; no restarts left (max_restarts=0)."
    assert result.message in capsys.readouterr().err
    assert set(records(tmp_path, restart=1)) == set()


def test_restarts_run_out_when_the_failure_repeats(tmp_path, capsys):
    result = launch([PROBE, str(tmp_path), "--fail", "worker 0", "--exit", "3", "--always"],
                    num_workers=2, max_restarts=2, grace_period=5)

    assert (result.exit_code, result.restarts, len(result.failures)) == (3, 2, 3)
    assert [f.restart for f in result.failures] == [0, 1, 2]
    assert result.message == "worker 0 exited with status 3; no restarts left (max_restarts=2)."


def test_min_workers_goes_on_with_fewer_workers_when_restarts_run_out(tmp_path, capsys):
    """#30 item 6: worker 1 fails on every attempt it is in; with 1 restart at each size the group
    of 3 goes on as 2 workers (TF_CONFIG names 2), then as 1, which finishes."""
    result = launch([PROBE, str(tmp_path), "--fail", "worker 1", "--exit", "3", "--always"],
                    num_workers=3, max_restarts=1, min_workers=1, grace_period=5)

    assert (result.exit_code, result.restarts, result.num_workers) == (0, 4, 1)
    assert [f.description for f in result.failures] == ["worker 1 exited with status 3"] * 4
    assert [sorted(records(tmp_path, restart=r)) for r in range(5)] == [
        ["worker 0", "worker 1", "worker 2"]] * 2 + [["worker 0", "worker 1"]] * 2 + [["worker 0"]]
    assert len(records(tmp_path, restart=4)["worker 0"]["tf_config"]["cluster"]["worker"]) == 1
    err = capsys.readouterr().err
    assert ("kerasdist launch: worker 1 exited with status 3; no restarts left at this size (max_restarts=1): "
            "going on with 2 workers (min_workers=1) on fresh ports.") in err
    assert "going on with 1 worker (min_workers=1)" in err
    assert "kerasdist launch: all 1 worker finished after 4 restarts." in err


def test_min_workers_stops_at_its_floor(tmp_path):
    result = launch([PROBE, str(tmp_path), "--fail", "worker 0", "--exit", "3", "--always"],
                    num_workers=2, min_workers=1, grace_period=5)
    assert (result.exit_code, result.restarts, result.num_workers) == (3, 1, 1)
    assert result.message == "worker 0 exited with status 3; no restarts left (max_restarts=0)."


def test_timeout_stops_the_run_and_says_so(tmp_path, capsys):
    start = time.monotonic()
    result = launch([PROBE, str(tmp_path), "--serve", "worker"], num_workers=2, timeout=1.5,
                    grace_period=5)

    assert time.monotonic() - start < 60  # the workers serve forever unless stopped; 1.6 s in a loaded full run
    assert result.timed_out and result.exit_code == 124 and result.failed is None
    assert result.message.startswith("timeout of 1.5 s reached")
    assert "timeout of 1.5 s reached" in capsys.readouterr().err
    assert not any(alive(r["pid"]) for r in records(tmp_path).values())


def test_a_port_taken_at_start_is_retried_without_using_a_restart(tmp_path, capsys):
    marker = tmp_path / "clashed"
    result = launch([PROBE, str(tmp_path), "--clash-once", str(marker)], num_workers=2)

    assert (result.exit_code, result.restarts, result.port_retries) == (0, 0, 1)
    assert marker.exists()
    assert "a port was already in use" in capsys.readouterr().err


def test_a_port_clash_is_seen_when_the_output_is_read_after_the_exit(tmp_path, capsys, monkeypatch):
    """The failed task's last lines are read before the launcher decides why it failed (once, on
    a loaded machine, the exit was seen first and the clash was taken for a plain failure)."""
    from kerasdist.launch import process_group

    def slow_reader(line: str) -> bool:
        time.sleep(0.2)  # each line reaches the launcher well after the process has exited
        return False

    monkeypatch.setattr(process_group, "is_start_up_noise", slow_reader)
    result = launch([PROBE, str(tmp_path), "--clash-once", str(tmp_path / "clashed")], num_workers=2)
    assert (result.exit_code, result.restarts, result.port_retries) == (0, 0, 1)
    assert "a port was already in use" in capsys.readouterr().err


def test_any_command_runs_with_the_task_variables(tmp_path, capsys):
    echo_task = 'echo "$KERASDIST_TASK_TYPE/$KERASDIST_TASK_INDEX"'
    result = launch(["sh", "-c", echo_task], num_workers=2)
    assert result.ok
    out = capsys.readouterr().out
    assert "[worker 0] worker/0\n" in out and "[worker 1] worker/1\n" in out

    result = launch(f"{sys.executable} {PROBE} {tmp_path}", num_workers=1)  # one string, split
    assert result.ok and sorted(records(tmp_path)) == ["worker 0"]


@pytest.mark.skipif(shutil.which("Rscript") is None, reason="no Rscript")
def test_an_r_script_runs_with_rscript(tmp_path, capsys):
    result = launch([str(R_TASK), str(tmp_path)], num_workers=2)
    assert result.ok
    tasks = {json.loads(p.read_text())["task"]["index"] for p in tmp_path.glob("0-worker-*.json")}
    assert tasks == {0, 1}
    assert "[worker 1] TF_CONFIG task: worker 1" in capsys.readouterr().out


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_workers": 0}, "num_workers must be an integer >= 1, got 0"),
        ({"num_workers": 2.5}, "num_workers must be an integer"),
        ({"num_ps": -1}, "num_ps must be an integer >= 0, got -1"),
        ({"max_restarts": -1}, "max_restarts must be an integer >= 0, got -1"),
        ({"min_workers": 0}, "min_workers must be an integer >= 1, got 0"),
        ({"min_workers": 3}, "min_workers must be at most num_workers (2), got 3"),
        ({"min_workers": 1, "num_ps": 1}, "min_workers is for groups without parameter servers"),
        ({"timeout": 0}, "timeout must be more than 0 seconds"),
        ({"command": []}, "command is empty"),
        ({"command": ""}, "command is empty"),
        ({"command": ["kerasdist-no-such-program"]},
         "command: 'kerasdist-no-such-program' was not found on PATH"),
        ({"command": ["no_such_script.py"]},
         "command: the script 'no_such_script.py' does not exist"),
        ({"command": ["python3", "no_such_script.py"]},
         "the script 'no_such_script.py' does not exist"),
        ({"command": ["./no-such-file"]}, "command: './no-such-file' is not an executable file"),
        ({"host": "203.0.113.9"}, "host: cannot bind to '203.0.113.9'"),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(v),
)
def test_bad_input_is_refused_before_anything_starts(tmp_path, kwargs, message):
    arguments = {"command": [PROBE, str(tmp_path)], "num_workers": 2, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        launch(**arguments)
    assert list(tmp_path.iterdir()) == []


def test_cli_help_names_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["launch", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("-n N", "--ps P", "--max-restarts R", "--min-workers M", "--host", "--timeout S", "-- COMMAND",
                   "no authentication", "chief"):
        assert option in out


def test_cli_exits_with_the_failing_status_and_names_the_process(tmp_path, capsys):
    code = main(["launch", "-n", "2", "--max-restarts", "0", "--grace-period", "5", "--",
                 PROBE, str(tmp_path), "--fail", "worker 1", "--exit", "3", "--sleep", "60"])
    assert code == 3
    out, err = capsys.readouterr()
    assert "[worker 0] hello from worker 0 (restart 0)" in out
    assert "worker 1 exited with status 3; no restarts left (max_restarts=0)." in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-n", "0", "--", PROBE], "-n/--num-workers: must be at least 1, got 0"),
        (["-n", "2", "--ps", "-1", "--", PROBE], "--ps: must be at least 0, got -1"),
        (["-n", "2", "--max-restarts", "-1", "--", PROBE], "--max-restarts: must be at least 0"),
        (["-n", "2", "--min-workers", "0", "--", PROBE], "--min-workers: must be at least 1, got 0"),
        (["-n", "2", "--timeout", "0", "--", PROBE], "--timeout: must be more than 0 seconds"),
    ],
    ids=["n", "ps", "max-restarts", "min-workers", "timeout"],
)
def test_cli_bad_options_are_named(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["launch", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-n", "2", "--"], "launch: no command given"),
        (["-n", "2"], "launch: no command given"),
        (["-n", "2", "--", "no_such_script.py"], "command: the script 'no_such_script.py'"),
    ],
    ids=["empty-after-dashes", "no-command", "missing-script"],
)
def test_cli_bad_command_is_named(argv, message, capsys):
    assert main(["launch", *argv]) == 2
    assert f"kerasdist: error: {message}" in capsys.readouterr().err


def test_a_stopped_launcher_stops_its_group(tmp_path):
    """SIGTERM to `python -m kerasdist launch` stops its processes and exits 130. In a process of
    its own: in pytest's, an earlier in-process test's TensorFlow may hold SIGTERM."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "kerasdist", "launch", "-n", "2", "--grace-period", "5", "--",
         PROBE, str(tmp_path), "--serve", "worker"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "SLURM_JOB_ID", "SLURM_PROCID")})
    deadline = time.monotonic() + 60
    while len(records(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    launcher.send_signal(signal.SIGTERM)
    out, err = launcher.communicate(timeout=60)

    assert launcher.returncode == 130, err
    seen = records(tmp_path)
    assert sorted(seen) == ["worker 0", "worker 1"]
    assert not any(alive(r["pid"]) for r in seen.values())
    assert "[worker 1] hello from worker 1 (restart 0)" in out
    assert "interrupted; the group was stopped" in err


def test_a_worker_that_never_comes_up_is_named_after_the_startup_timeout(tmp_path):
    serve_one = tmp_path / "serve_one.py"
    serve_one.write_text(
        "import json, os, socket, time\n"
        "config = json.loads(os.environ['TF_CONFIG'])\n"
        "if config['task']['index'] == 0:  # worker 0 listens like a TF server; worker 1 never does\n"
        "    host, port = config['cluster']['worker'][0].rsplit(':', 1)\n"
        "    server = socket.socket(); server.bind((host, int(port))); server.listen()\n"
        "time.sleep(300)\n"
    )
    started = time.monotonic()
    result = kerasdist.launch([str(serve_one)], num_workers=2, startup_timeout=2, grace_period=1)
    assert time.monotonic() - started < 90  # ended at the start-up timeout, not after the 300 s sleep
    assert result.exit_code == 124 and not result.timed_out
    assert result.failed.task == "worker 1"
    assert result.failed.description.startswith("worker 1 did not come up within 2 s (nothing listens on 127.0.0.1:")


def test_a_launcher_killed_with_sigkill_leaves_no_process_behind(tmp_path):
    """SIGKILL gives the launcher no chance to stop its group: Linux's parent-death signal does."""
    import subprocess

    launcher = subprocess.Popen([sys.executable, "-m", "kerasdist", "launch", "-n", "2", "--",
                                 PROBE, str(tmp_path), "--serve", "worker"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(records(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [r["pid"] for r in records(tmp_path).values()]
    assert len(pids) == 2
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 15
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids)
