"""What the object-store test servers share (`s3_test_server`, `gcs_test_server`).

A server binary runs in its own process group, writes its log and keeps its data in a temporary
directory, is waited for until it answers, and is always stopped: by `stop()`, or when the
process that started it exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def executable(name: str) -> str | None:
    """The executable `name`: next to this Python (installed by a wheel) or on the PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def free_ports(count: int) -> list[int]:
    """`count` distinct ports on 127.0.0.1 that nothing listens on right now."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class SilentEndpoint:
    """An endpoint that takes connections and never answers, as a hung store does: for the bound
    on a store's first answer. A port nothing listens on is no such endpoint: the client's own
    retries give it up after a random 2-26 s (botocore's backoff), sometimes before the bound."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0), backlog=64)  # never accepted
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> SilentEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ServerProcess:
    """A test server's process. Subclasses name it, say how long `stop` waits after SIGTERM
    before SIGKILL, and implement `_check_ready` (raises until the server answers).

    Attributes:
        command: the command line (run again, on the same ports and data, by `start`).
        data_dir: the server's temporary directory (removed by `stop`).
        process: the running process, or None before the first start.
    """

    name = "server"
    stop_grace = 5.0  # seconds between SIGTERM and SIGKILL

    def __init__(self, command: list[str], data_dir: Path):
        self.command, self.data_dir = command, data_dir
        self._log = open(data_dir / f"{self.name}.log", "wb")  # noqa: SIM115 (closed by stop)
        self.process: subprocess.Popen[bytes] | None = None
        atexit.register(self.stop)

    def start(self, timeout: float = 60.0) -> None:
        """Start (or restart, on the same ports and data) the server and wait until it answers."""
        if self.running:
            return
        self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self._wait_ready(timeout)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _check_ready(self) -> None:
        raise NotImplementedError

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}: {self._log_tail()}")
            try:
                self._check_ready()
                return
            except Exception:  # noqa: BLE001 (not up yet: any error)
                if time.monotonic() > deadline:
                    self.stop(remove=False)
                    raise RuntimeError(f"{self.name} not ready after {timeout} s: {self._log_tail()}") from None
                time.sleep(0.3)

    def _log_tail(self) -> str:
        try:
            return (self.data_dir / f"{self.name}.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def stop(self, remove: bool = True) -> None:
        """Stop the server (its whole process group: SIGTERM, SIGKILL after `stop_grace`
        seconds); with `remove`, delete its data too."""
        if self.running:
            if self.stop_grace > 0:
                self._signal_group(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(self.stop_grace)
            if self.process.poll() is None:
                self._signal_group(signal.SIGKILL)
            self.process.wait()
        if remove:
            self._log.close()
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)
