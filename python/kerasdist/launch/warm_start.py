"""Warm start: Python processes forked from one that has already imported TensorFlow.

A Python process that imports kerasdist spends about 6 s of CPU (more on a loaded machine)
importing TensorFlow and Keras before it trains: on a restart after a failure that is most of the
time to the first resumed step, and on a busy 2-core machine it is most of what a short run costs.
A warm-start server imports them once, listens on a Unix socket, and forks a process for each
request, which then runs the requested script, `-c` code or `-m` module as `python` would.

The client (`python warm_start.py run SOCKET -- ARGV...`, stdlib only, so it starts in
milliseconds) is what a launcher runs in a worker's place. It hands the server its argv,
environment, working directory and standard streams, forwards the signals it gets to the forked
process, and exits with that process's status (or dies of the same signal), so to whoever started
it, it is the worker. A client killed outright (SIGKILL) takes the forked process with it.

The forked process is not a fresh interpreter: what the import read from the environment is fixed
(TensorFlow's log level and oneDNN switch, the Keras backend, the hash seed, sys.path, ...). A
request whose environment differs there, or that asks for interpreter options, is refused, and the
client runs a fresh `python` instead (`exec`, same pid): never a wrong process, at worst a cold one.

`python PATH/kerasdist/launch/warm_start.py serve SOCKET` (the file of the installed package, run
as a script: `-m` would import kerasdist into the server) runs a server until SIGTERM, and then
until the processes it forked have ended; SOCKET is a path, or `@name` for an abstract socket (one
per host). `launch(warm_start=True)` runs one for its groups, and `KERASDIST_WARM_START=SOCKET` has the
launcher use an existing one. Not under Slurm's steps: there a forked process would belong to the
server's step, not its client's, for Slurm's signals, kills and accounting (RELIABILITY.md).
"""

from __future__ import annotations

import gc
import io
import json
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

SOCKET_VARIABLE = "KERASDIST_WARM_START"
# Read while TensorFlow, Keras or kerasdist are imported, or by the interpreter at its start: a
# forked process would keep the server's values, so a request that differs is run cold.
_IMPORT_TIME_PREFIXES = ("TF_", "KERAS_", "PYTHON", "CUDA_", "OMP_", "MKL_", "KMP_", "XLA_", "LD_")
_IMPORT_TIME_NAMES = ("KERASDIST_VERBOSE",)  # (the others are read by `import kerasdist`, in each process)
# Read after the import, so free to differ: the cluster, stdout's buffering, and the GPU allocator's
# growth (read when the first GPU is set up, as the advisor's measuring processes ask for it).
_RUN_TIME_NAMES = ("TF_CONFIG", "PYTHONUNBUFFERED", "TF_FORCE_GPU_ALLOW_GROWTH")
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_HEADER = struct.Struct("!I")


def import_time_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of an environment a warm process cannot change: it was read at the import."""
    return {
        name: value for name, value in environ.items()
        if (name.startswith(_IMPORT_TIME_PREFIXES) or name in _IMPORT_TIME_NAMES)
        and name not in _RUN_TIME_NAMES
    }


def client_command(socket_path: str, argv: Sequence[str]) -> list[str]:
    """The argv that runs `argv` (a Python command: [python, script.py, ...]) warm from `socket_path`."""
    return [argv[0], "-S", os.path.abspath(__file__), "run", socket_path, "--", *argv[1:]]


class WarmServer:
    """A server this process started (`start`), for the Python processes of a run; `stop` ends it.

    Its environment is the one the run's processes get (less what each sets for itself, such as
    TF_CONFIG), so their requests match it. On Linux it dies with the process that started it."""

    def __init__(self, python: str, environ: Mapping[str, str]):
        self.environment = import_time_environment(environ)  # what a request must match
        self.folder = tempfile.mkdtemp(prefix="kerasdist-warm-")
        self.socket_path = os.path.join(self.folder, "socket")
        self.log_path = os.path.join(self.folder, "server.log")
        command = [python, os.path.abspath(__file__), "serve", self.socket_path]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                dying_with_parent(command, python), env=dict(environ), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float) -> bool:
        """Whether it listens within `timeout` seconds (its import of TensorFlow done)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.process.poll() is None:
            if os.path.exists(self.socket_path):
                return True
            time.sleep(0.05)
        return os.path.exists(self.socket_path) and self.process.poll() is None

    def why_not_ready(self) -> str:
        with open(self.log_path, errors="replace") as log:
            lines = log.read().strip().splitlines()
        status = self.process.poll()
        return (f"it exited with status {status}" if status is not None else "it did not start in time") + (
            f": {lines[-1]}" if lines else "")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def dying_with_parent(command: list[str], python: str) -> list[str]:
    """`command`, set on Linux (by `python`, for a moment) to get SIGTERM when this process dies."""
    if not sys.platform.startswith("linux"):
        return command
    return [python, "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *command]


# Runs first in a process this one starts, then execs its command in its place (same pid): asks Linux
# to send it SIGTERM when its parent dies, so that a parent killed with SIGKILL leaves nothing behind.
_DIE_WITH_PARENT = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):  # the parent died before the request was made
    sys.exit(128 + signal.SIGTERM)
os.execvp(sys.argv[2], sys.argv[2:])
"""


# --------------------------------------------------------------------------------------------
# The client


def run(socket_path: str, argv: list[str], wait: float = 0.0) -> NoReturn:
    """Run `python ARGV` forked from the server at `socket_path`, or cold when it cannot be;
    `wait`: seconds to wait for a server that is still starting (nothing listens there yet)."""
    python = sys.executable
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)  # until the pid is known
    env, forked_argv = dict(os.environ), list(argv)
    if forked_argv[:1] == ["-u"]:  # the one interpreter option a forked process can honour
        env["PYTHONUNBUFFERED"], forked_argv = "1", forked_argv[1:]
    try:
        connection = _connect(socket_path, wait)
        request = {"argv": forked_argv, "env": env, "cwd": os.getcwd(), "python": python}
        _send(connection, request, fds=[0, 1, 2])
        reader = connection.makefile("rb")
        reply = json.loads(reader.readline() or b'{"refused": "the server closed the connection"}')
    except (OSError, ValueError):
        reply = {"refused": "no warm-start server answers there"}
    if "refused" in reply:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        os.execv(python, [python, *argv])
    pid = reply["pid"]
    for number in _FORWARDED:
        signal.signal(number, lambda received, _frame: _forward(pid, received))
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    line = reader.readline()
    if not line:
        print(f"kerasdist warm start: the server went away while process {pid} ran", file=sys.stderr)
        os._exit(1)
    exit_like(json.loads(line)["status"])


def _connect(socket_path: str, wait: float) -> socket.socket:
    end = time.monotonic() + wait
    while True:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(_address(socket_path))
            return connection
        except (FileNotFoundError, ConnectionRefusedError):
            connection.close()
            if time.monotonic() >= end:
                raise
            time.sleep(0.1)


def _forward(pid: int, number: int) -> None:
    try:
        os.killpg(pid, number)  # the server made it a process group leader
    except ProcessLookupError:
        pass


def exit_like(wait_status: int) -> NoReturn:
    code = os.waitstatus_to_exitcode(wait_status)
    if code < 0:  # die of the same signal (SIGKILL's action cannot be set: it is always death)
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)


# --------------------------------------------------------------------------------------------
# The server


def serve(socket_path: str) -> None:
    """Import TensorFlow and Keras once, then fork a process per request until SIGTERM (and its
    forked processes have ended)."""
    if "kerasdist" in sys.modules:
        raise SystemExit("kerasdist warm start: run the server as a script (python PATH/warm_start.py serve "
                         "SOCKET), not with -m: the processes it forks must import kerasdist themselves")
    asked = import_time_environment(os.environ)
    before = dict(os.environ)
    import_tensorflow_and_keras()
    set_by_import = {name: value for name, value in os.environ.items() if name not in before}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(_address(socket_path))  # a client that finds the socket finds a ready server
    listener.listen(64)
    wake_read, wake_write = socket.socketpair()
    wake_write.setblocking(False)
    previous_wakeup = signal.set_wakeup_fd(wake_write.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the loop through wake_write
    server = _Server(listener, wake_read, wake_write, previous_wakeup, asked, set_by_import)
    signal.signal(signal.SIGTERM, lambda *_: server.drain(socket_path))
    server.loop()


def import_tensorflow_and_keras() -> None:
    """TensorFlow and Keras, imported as `import kerasdist` imports them (kerasdist/startup.py,
    quietly), but not kerasdist itself: each forked process imports it (about 0.1 s more), and so
    installs its SIGTERM guard and reads its settings from its own environment."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "startup.py")
    spec = importlib.util.spec_from_file_location("_kerasdist_startup_for_warm_start", path)
    startup = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(startup)  # type: ignore[union-attr]
    startup.import_tensorflow_quietly()
    import keras  # noqa: F401

    # Shared by every forked process: frozen, no collection in them walks it (nor copies its pages).
    gc.freeze()


def _address(socket_path: str) -> str:
    """A path, or `@name` for an abstract socket: one per network namespace (per host, also for
    hosts simulated on one machine), with no file to leave behind."""
    return "\0" + socket_path[1:] if socket_path.startswith("@") else socket_path


class _Server:
    def __init__(self, listener: socket.socket, wake_read: socket.socket, wake_write: socket.socket,
                 previous_wakeup: int, environment: dict[str, str], set_by_import: dict[str, str]):
        self.listener, self.wake_read, self.wake_write = listener, wake_read, wake_write
        self.previous_wakeup = previous_wakeup
        self.environment = environment  # as it was before the import
        self.set_by_import = set_by_import  # what the import added (TF_CPP_MIN_LOG_LEVEL=1)
        self.children: dict[int, socket.socket] = {}
        self.draining = False
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        self.selector.register(wake_read, selectors.EVENT_READ)

    def drain(self, socket_path: str) -> None:
        """SIGTERM: take no more requests, and end once every forked process has ended and its
        client has its status (a job's SIGTERM reaches the server and the training alike)."""
        if not self.draining:
            self.draining = True
            self.selector.unregister(self.listener)
            self.listener.close()
            if not socket_path.startswith("@"):
                with _suppressed(OSError):
                    os.unlink(socket_path)

    def loop(self) -> None:
        while not (self.draining and not self.children):
            for key, _ in self.selector.select():
                if key.fileobj is self.listener:
                    self._answer(self.listener.accept()[0])
                else:
                    self.wake_read.recv(4096)
                    self._reap()

    def _answer(self, connection: socket.socket) -> None:
        if _peer_uid(connection) != os.getuid():  # whoever connects runs code as this user: only itself
            connection.close()
            return
        connection.settimeout(10)
        try:
            request, fds = _receive(connection)
        except (OSError, ValueError):
            connection.close()
            return
        refusal = self._refusal(request)
        if refusal:
            print(f"kerasdist warm start: {request['argv'][:1]} starts cold: {refusal}", file=sys.stderr, flush=True)
            with _suppressed(OSError):
                connection.sendall(json.dumps({"refused": refusal}).encode() + b"\n")
            connection.close()
            for fd in fds:
                os.close(fd)
            return
        connection.settimeout(None)
        # Signals wait until the child has its own handlers (the server's SIGTERM would stop the server)
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)
        pid = os.fork()
        if pid == 0:
            self._become(request, fds, connection, mask)  # never returns
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        with _suppressed(OSError):  # its own process group before the client can signal it
            os.setpgid(pid, pid)
        for fd in fds:
            os.close(fd)
        self.children[pid] = connection
        with _suppressed(OSError):
            connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")

    def _refusal(self, request: dict[str, Any]) -> str:
        if request.get("python") != sys.executable:  # the path: -S hides a virtualenv's sys.prefix
            return "another Python interpreter"
        if entry_point(request["argv"]) is None:
            return "interpreter options"
        differing = sorted(set(self.environment.items()) ^ set(import_time_environment(request["env"]).items()))
        if differing:
            return "import-time environment differs: " + ", ".join(sorted({name for name, _ in differing}))
        return ""

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            connection = self.children.pop(pid, None)
            if connection is not None:
                with _suppressed(OSError):
                    connection.sendall(json.dumps({"status": status}).encode() + b"\n")
                connection.close()

    def _become(self, request: dict[str, Any], fds: list[int], connection: socket.socket,
                mask: set[signal.Signals]) -> NoReturn:
        """In the forked process: drop the server's state, take the client's streams,
        environment and directory, and run its command as `python` would."""
        signal.set_wakeup_fd(self.previous_wakeup)
        for number in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self.selector.close()
        for sock in (self.listener, self.wake_read, self.wake_write, *self.children.values()):
            sock.close()  # (closing one already closed does nothing)
        os.setpgid(0, 0)  # its own process group, as a launched worker has: signals reach its children
        threading.Thread(target=_die_with_client, args=(connection,), daemon=True).start()
        _take_streams(fds, request["env"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for name, value in self.set_by_import.items():
            os.environ.setdefault(name, value)
        run_forked(request["argv"], mask)


def _peer_uid(connection: socket.socket) -> int:
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", credentials)[1]


def _die_with_client(connection: socket.socket) -> None:
    """The client sends nothing after its request: the end of the connection is its death."""
    with _suppressed(OSError):
        while connection.recv(1):
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def _take_streams(fds: list[int], env: Mapping[str, str]) -> None:
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        raw: Any = io.FileIO(fd, "w", closefd=False)
        stream = io.TextIOWrapper(
            raw if unbuffered else io.BufferedWriter(raw), encoding=old.encoding, errors=old.errors,
            write_through=unbuffered or name == "stderr", line_buffering=os.isatty(fd) or name == "stderr")
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def run_forked(argv: list[str], mask: set[signal.Signals]) -> NoReturn:
    """In a process just forked from one that imported TensorFlow (its streams, environment and
    directory set): run `argv` ([script | -c code | -m module, args...]) as `python` would, with
    the signal mask `mask` back, and exit with its status (the supervisor's children too)."""
    _fresh_process_state()
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    raise SystemExit(_run_command(argv))


def _fresh_process_state() -> None:
    """What a fresh interpreter would not share with its siblings: numpy's global random state
    (Python's `random` reseeds itself after a fork)."""
    import numpy as np

    np.random.seed()


def entry_point(argv: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """("script", path, args), ("-c", code, args) or ("-m", module, args); None for anything else
    (interpreter options such as -u, -X, -W change the interpreter, which is already running)."""
    if not argv:
        return None
    first = argv[0]
    if first in ("-c", "-m") and len(argv) >= 2:
        return first, argv[1], list(argv[2:])
    if first.startswith("-"):
        return None
    return "script", first, list(argv[1:])


def _run_command(argv: list[str]) -> int | str | None:
    import runpy
    import traceback
    import types

    kind, target, args = entry_point(argv)  # type: ignore[misc]  # checked before the fork
    try:
        if kind == "script":
            sys.argv = [target, *args]
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
        elif kind == "-c":
            sys.argv = ["-c", *args]
            sys.path[0] = ""
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)
        else:
            sys.argv = [target, *args]
            sys.path[0] = os.getcwd()
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as done:
        return done.code
    except KeyboardInterrupt:
        traceback.print_exc()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # as the interpreter would: its excepthook (kerasdist's may exit 76), then 1
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


# --------------------------------------------------------------------------------------------
# The wire: a length-prefixed JSON request with the client's three standard streams attached


def _send(connection: socket.socket, message: dict[str, Any], fds: list[int]) -> None:
    body = json.dumps(message).encode()
    socket.send_fds(connection, [_HEADER.pack(len(body))], fds)
    connection.sendall(body)


def _receive(connection: socket.socket) -> tuple[dict[str, Any], list[int]]:
    header, fds, _flags, _address = socket.recv_fds(connection, _HEADER.size, 3)
    if len(header) != _HEADER.size or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ValueError("a request without its header and three streams")
    (size,) = _HEADER.unpack(header)
    body = b""
    while len(body) < size:
        chunk = connection.recv(size - len(body))
        if not chunk:
            raise ValueError("a request cut short")
        body += chunk
    return json.loads(body), fds


class _suppressed:
    def __init__(self, *kinds: type[BaseException]):
        self.kinds = kinds

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, *_: Any) -> bool:
        return kind is not None and issubclass(kind, self.kinds)


def main(argv: list[str]) -> None:
    usage = "usage: warm_start.py serve SOCKET | warm_start.py run SOCKET [--wait SECONDS] -- PYTHON_ARGS..."
    if len(argv) >= 2 and argv[0] == "serve":
        serve(argv[1])
    elif len(argv) >= 3 and argv[0] == "run" and "--" in argv:
        options = argv[2:argv.index("--")]
        if options and (len(options) != 2 or options[0] != "--wait" or not _is_number(options[1])):
            raise SystemExit(usage)
        run(argv[1], argv[argv.index("--") + 1:], float(options[1]) if options else 0.0)
    else:
        raise SystemExit(usage)


def _is_number(text: str) -> bool:
    try:
        return float(text) >= 0
    except ValueError:
        return False


if __name__ == "__main__":
    main(sys.argv[1:])
