"""The other workers of a multi-worker fit, reached through TensorFlow's coordination service (its
key-value store, `compat.coordination_store`): what the step watchdog tells them (a hang
declared, where each worker stands, the chief's verdict, the chief's saves, during which no step
can end anywhere) and the step figures each worker gives the chief (`step_times`).

The store lives in the coordination service's leader (worker 0 or the chief) and answers from C++
threads, so it works while every training thread waits in a collective, and without a disk the
hosts share. Nothing here is ever in training's way: writes the training thread asks for go
through one background thread, in order, and every read has a short timeout.
"""

from __future__ import annotations

import contextlib
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kerasdist import compat

_PREFIX = "kerasdist"


def task_names(strategy: Any) -> list[str]:
    """Every task that trains in `strategy`'s cluster ("chief:0", "worker:0", ...), in order."""
    resolver = getattr(strategy, "cluster_resolver", None)
    try:
        spec = resolver.cluster_spec().as_dict()
    except Exception:  # noqa: BLE001 - no cluster (one process, a strategy without a resolver)
        return []
    jobs = [job for job in ("chief", "worker") if job in spec]
    return [f"{job}:{index}" for job in jobs for index in range(len(spec[job]))]


class Peers:
    """This task and the others of its cluster, and the store they share (see the module docstring).

    Attributes:
        task: this process's task ("worker:1").
        others: the other tasks that train.
        chief: the task that writes checkpoints and the run log.
    """

    def __init__(self, store: Any, task: str, tasks: list[str], chief: str):
        self.store = store
        self.task = task
        self.others = [name for name in tasks if name != task]
        self.chief = chief
        self._writer: ThreadPoolExecutor | None = None

    @classmethod
    def of(cls, context: Any) -> Peers | None:
        """The peers of the fit in `context` (a `RunContext`), or None: one worker, parameter
        servers (their coordinator schedules steps itself), or no store."""
        if context.num_workers < 2 or context.is_parameter_server or context.task is None:
            return None
        store = compat.coordination_store()
        tasks = task_names(context.strategy)
        if store is None or context.task not in tasks:
            return None
        return cls(store, context.task, tasks, tasks[0])

    # -- writes -------------------------------------------------------------------------------
    def put(self, name: str, value: Any) -> bool:
        """Store `value` (JSON) under `name`, now; whether it was stored (a name is written once)."""
        return self.store.put(_key(name), json.dumps(value))

    def put_later(self, name: str, value: Any) -> None:
        """`put`, from the background thread (the training thread goes on at once)."""
        self._background().submit(self.put, name, value)

    def delete_later(self, name: str) -> None:
        self._background().submit(self.store.delete, _key(name))

    # -- reads --------------------------------------------------------------------------------
    def get(self, name: str, timeout_seconds: float) -> Any:
        """The value stored under `name`, waiting up to `timeout_seconds`; None without."""
        text = self.store.get(_key(name), timeout_seconds)
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return None

    def close(self, wait_seconds: float = 0.0) -> None:
        """Stop the background thread, after what it still has to write (up to `wait_seconds`)."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        if wait_seconds > 0:
            with contextlib.suppress(Exception):  # a write still waiting on a service that is gone
                writer.submit(lambda: None).result(timeout=wait_seconds)
        writer.shutdown(wait=False)

    def _background(self) -> ThreadPoolExecutor:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kerasdist-peers")
        return self._writer


def _key(name: str) -> str:
    return f"{_PREFIX}/{name}"
