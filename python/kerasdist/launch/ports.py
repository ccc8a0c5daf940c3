"""Ports for a local cluster: free ones picked on `host`, and how to tell that one was taken.

The ports are found free, then released, so another program may grab one before a task's
TensorFlow server binds it. The server then says so (`port_clash`), and the launcher starts the
group again on fresh ports, up to `PORT_CLASH_RETRIES` times, without using a restart.
"""

from __future__ import annotations

import re
import socket

PORT_CLASH_RETRIES = 3
# What a TensorFlow server prints when its port was taken between picking and binding.
_PORT_CLASH = re.compile(r"address already in use|could not start grpc server", re.IGNORECASE)


def build_cluster(tasks: list[tuple[str, int]], host: str) -> dict[str, list[str]]:
    """Free ports for every task, re-checked just before use (another program may take one)."""
    for _ in range(5):
        ports = free_ports(host, len(tasks))
        if all(_port_is_free(host, port) for port in ports):
            break
    address = f"[{host}]" if ":" in host else host
    cluster: dict[str, list[str]] = {}
    for (task_type, _), port in zip(tasks, ports, strict=True):
        cluster.setdefault(task_type, []).append(f"{address}:{port}")
    return cluster


def port_clash(line: str) -> bool:
    """Whether a task's output line says its server's port was already taken."""
    return _PORT_CLASH.search(line) is not None


def check_host(host: str) -> None:
    """Raises ValueError unless `host` is an address this machine can bind ports on."""
    if not isinstance(host, str) or not host.strip():
        raise ValueError(f"host must be a non-empty address such as '127.0.0.1', got {host!r}.")
    try:
        free_ports(host, 1)
    except OSError as err:
        raise ValueError(
            f"host: cannot bind to {host!r} on this machine ({err.strerror or err}); the "
            "launcher starts every task here, so host must be a local address."
        ) from None


def free_ports(host: str, count: int) -> list[int]:
    """`count` distinct ports the OS says are free (all bound at once, then released)."""
    sockets = []
    try:
        for _ in range(count):
            sock = _socket(host)
            sockets.append(sock)
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def accepts_connections(address: str) -> bool:
    """Whether something listens on "host:port" (a task's server is up)."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.2):
            return True
    except OSError:
        return False


def _port_is_free(host: str, port: int) -> bool:
    with _socket(host) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _socket(host: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.socket(family, socket.SOCK_STREAM)
