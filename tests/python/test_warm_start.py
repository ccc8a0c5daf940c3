"""Warm start (kerasdist.launch.warm_start): a Python process forked from a server that has already
imported TensorFlow is, to whoever started it, the process it asked for: its argv, directory,
environment, streams and exit status, signals included; anything the fork cannot honour runs cold.

The whole suite runs its Python processes through the session's server (conftest.py), so every
test that starts one exercises it; these tests check the contract itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

import kerasdist
from kerasdist.launch import warm_start

REPORT = textwrap.dedent("""
    import gc, json, os, sys
    warm = "tensorflow" in sys.modules  # before this script imported anything of its own
    frozen = gc.get_freeze_count() > 0  # what the server's import made: no collection walks it
    if "--kerasdist" in sys.argv:  # its SIGTERM guard: a cluster task exits 75 (without it, SIGTERM kills)
        import kerasdist
    line = sys.stdin.readline().strip() if "--read" in sys.argv else ""
    print(json.dumps({"warm": warm, "argv": sys.argv, "cwd": os.getcwd(), "x": os.environ.get("KD_X"),
                      "stdin": line, "pid": os.getpid(), "main": __name__, "frozen": frozen}), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if "--wait" in sys.argv:
        import time
        time.sleep(120)
    if os.environ.get("KD_DIE_FIRST") and os.environ.get("KERASDIST_RESTART") == "0":  # worker 1 dies, worker 0 waits
        import time
        reported = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "worker-0-reported")
        if os.environ["KERASDIST_TASK_INDEX"] == "0":
            open(reported, "w").close()
        else:  # once worker 0 has reported: its death stops worker 0, which may start later
            deadline = time.monotonic() + 60
            while not os.path.exists(reported) and time.monotonic() < deadline:
                time.sleep(0.02)
            os.kill(os.getpid(), 9)
        time.sleep(120)
    sys.exit(int(os.environ.get("KD_EXIT", "0")))
""")


@pytest.fixture
def script(tmp_path) -> Path:
    path = tmp_path / "report.py"
    path.write_text(REPORT)
    return path


@pytest.fixture
def server(warm_start_server):
    if warm_start_server is None:
        pytest.skip("the tests' warm-start server is off (KERASDIST_TEST_COLD)")
    return warm_start_server


def environment(server, **extra: str) -> dict[str, str]:
    """This process's environment with the server's import-time part (what an earlier test may have
    left in this process's environment would rightly make a process cold)."""
    mine = warm_start.import_time_environment(os.environ)
    return {**{k: v for k, v in os.environ.items() if k not in mine}, **server.environment, **extra}


def run_warm(server, script: Path, *args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    command = warm_start.client_command(server.socket_path, [sys.executable, str(script), *args])
    return subprocess.Popen(command, env=environment(server, **(env or {})), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_a_forked_process_has_the_clients_argv_directory_environment_streams_and_exit_status(server, script,
                                                                                            tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    client = run_warm(server, script, "a b", "--read", env={"KD_X": "x1", "KD_EXIT": "7"}, cwd=work)
    out, err = client.communicate("from stdin\n", timeout=120)
    report = json.loads(out)
    assert client.returncode == 7, err
    assert report == {"warm": True, "argv": [str(script), "a b", "--read"], "cwd": str(work), "x": "x1",
                      "stdin": "from stdin", "pid": report["pid"], "main": "__main__", "frozen": True}
    assert report["pid"] != client.pid and err == "to stderr\n"


def test_what_the_import_read_differently_an_interpreter_option_or_no_server_runs_cold_in_the_clients_place(
        server, script, tmp_path):
    for env, options, socket in (({"TF_CPP_MIN_LOG_LEVEL": "3"}, [], server.socket_path),
                                 ({}, ["-X", "dev"], server.socket_path), ({}, [], str(tmp_path / "none"))):
        command = warm_start.client_command(socket, [sys.executable, *options, str(script)])
        client = subprocess.Popen(command, env=environment(server, **env, KD_X="cold"), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        out, err = client.communicate(timeout=120)
        report = json.loads(out)
        assert client.returncode == 0, err
        # exec'd in its place
        assert (report["warm"], report["frozen"], report["x"], report["pid"]) == (False, False, "cold", client.pid)
        assert report["argv"] == [str(script)]


def test_signals_reach_the_forked_process_its_status_comes_back_and_it_dies_with_its_client(server, script):
    # SIGTERM: a cluster task (TF_CONFIG set) exits 75 outside training, as a cold one does
    task = {"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}
    cluster = {"TF_CONFIG": json.dumps(task)}
    client = run_warm(server, script, "--wait", "--kerasdist", env=cluster)
    report = json.loads(client.stdout.readline())
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=60) == kerasdist.PREEMPTED_EXIT_CODE
    assert report["warm"] and not _alive(report["pid"])
    # SIGKILL of the client, which cannot forward it: the forked process goes too
    client = run_warm(server, script, "--wait")
    report = json.loads(client.stdout.readline())
    client.kill()
    assert client.wait(timeout=60) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while _alive(report["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(report["pid"])


def test_launch_with_warm_start_forks_every_start_and_restart_and_ends_as_a_cold_launch(script, tmp_path, capfd,
                                                                                        monkeypatch):
    monkeypatch.delenv(warm_start.SOCKET_VARIABLE, raising=False)  # the launcher starts its own server
    monkeypatch.setenv("KD_DIE_FIRST", "1")  # the warm launch's first attempt fails; the cold launch's does not
    made, mkdtemp = [], tempfile.mkdtemp  # the folders this launch makes (a glob of /tmp would see other tests')
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *args, **kwargs: made.append(mkdtemp(*args, **kwargs)) or made[-1])
    result = kerasdist.launch([str(script)], num_workers=2, max_restarts=1, warm_start=True, timeout=240)
    out = capfd.readouterr().out
    reports = [json.loads(line.split("] ", 1)[1]) for line in out.splitlines() if line.startswith("[worker")
               and '"warm"' in line]
    assert result.ok and result.restarts == 1, out
    assert result.exit_codes == ({"worker 0": -signal.SIGTERM, "worker 1": -signal.SIGKILL},
                                 {"worker 0": 0, "worker 1": 0}), out
    assert len(reports) == 4 and all(r["warm"] for r in reports), reports
    servers = [folder for folder in made if Path(folder).name.startswith("kerasdist-warm-")]
    assert len(servers) == 1 and not os.path.exists(servers[0]), made  # its server stopped and cleaned up
    monkeypatch.delenv("KD_DIE_FIRST")
    cold = kerasdist.launch([str(script)], num_workers=1, warm_start=False, timeout=240)
    out = capfd.readouterr().out
    assert cold.ok and json.loads(out.split("] ", 1)[1].splitlines()[0])["warm"] is False


def test_warm_start_must_be_true_false_or_none(script):
    with pytest.raises(ValueError, match="warm_start must be True, False or None, got 'yes'"):
        kerasdist.launch([str(script)], num_workers=1, warm_start="yes")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False

