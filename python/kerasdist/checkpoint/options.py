"""The checkpoint options: one typed record, its one check and one docstring per field.

`CheckpointOptions` says when checkpoints are written, how, which are kept, what SIGTERM does and
when a fit that stopped stepping counts as hung.
`checkpoint_callback`, `CheckpointCallback`, `distributed_fit` and `custom_fit` take its fields
as keyword arguments (`takes_checkpoint_options` puts every field in their signature and their
docstring), build the record once (`CheckpointOptions.from_kwargs`, which checks it) and pass it
on; `option_docs` lists the fields and their docs for front ends (R) that forward them.

A new checkpoint option is a field here (its default, its line under `Attributes`, its check in
`__post_init__`) and its use in the part of the callback that acts on it (`save_policy`, `saver`,
`preemption_hold`, `watchdog`): every function above takes it, documented, with no other edit.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from kerasdist.validation import (
    boolean,
    choice,
    integer,
    optional_integer,
    optional_seconds,
    seconds_or_auto,
)

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class CheckpointOptions:
    """When checkpoints are written, how, which are kept, what SIGTERM does, and when a fit hangs.

    Attributes:
        every_epoch: save at each epoch end.
        every_steps: also save every this many steps (batches, also under gradient accumulation);
            None: only at epoch ends.
        every_seconds: also save at the first step end this many seconds after the last save (or
            the start of fit): time-based saves ("every 10 minutes": `every_seconds=600`), resumed
            like step saves. The chief alone decides and writes, so workers never wait on it.
            `kerasdist.goodput()` suggests a value from a run's failures and save cost.
        keep: how many of the newest checkpoints to keep (>= 1; the newest valid one is never
            deleted).
        keep_best: also keep the checkpoint with the best `monitor` value.
        monitor: the epoch metric `keep_best` compares, e.g. "loss" or "val_loss".
        mode: "min" or "max": whether a smaller or larger `monitor` is better.
        async_save: write checkpoints in a background thread (default True), so training waits
            only while the model's state is copied; False writes each one on the training thread
            before training goes on.
        storage_options: options for an object-store checkpoint directory (credentials,
            endpoint), checked by the store.
        handle_sigterm: on SIGTERM (preemption), save at the next step end and exit with status
            75; default True.
        hang_timeout: the step watchdog: after this many seconds without a training step (a
            callback, a data loader or a peer stuck), every thread's stack goes to stderr, the
            run log records the hang and the process exits with status 77 (`HUNG_EXIT_CODE`), for
            the launcher or scheduler to restart it. "auto" (default): ten times the slowest step
            of the fit so far, at least 120 s; None: no watchdog. The time before a fit's first
            step, saves and validation passes are not counted.
    """

    every_epoch: bool = True
    every_steps: int | None = None
    every_seconds: float | None = None
    keep: int = 3
    keep_best: bool = False
    monitor: str = "loss"
    mode: str = "min"
    async_save: bool = True
    storage_options: Mapping[str, Any] | None = None
    handle_sigterm: bool = True
    hang_timeout: float | str | None = "auto"

    def __post_init__(self) -> None:
        """The one check of the options (plain Python numbers kept)."""
        boolean("async_save", self.async_save)
        boolean("every_epoch", self.every_epoch)
        object.__setattr__(self, "every_steps", optional_integer("every_steps", self.every_steps, 1))
        object.__setattr__(self, "every_seconds", optional_seconds("every_seconds", self.every_seconds))
        if not self.every_epoch and self.every_steps is None and self.every_seconds is None:
            raise ValueError("every_epoch is False and every_steps and every_seconds are None: the callback "
                             "would never save.")
        object.__setattr__(self, "keep", integer("keep", self.keep, 1, hint="the newest checkpoint is always kept"))
        boolean("keep_best", self.keep_best)
        choice("mode", self.mode, ("min", "max"))
        if not isinstance(self.monitor, str) or not self.monitor:
            raise ValueError(f"monitor must be a metric name such as 'loss', got {self.monitor!r}.")
        boolean("handle_sigterm", self.handle_sigterm)
        object.__setattr__(self, "hang_timeout", seconds_or_auto("hang_timeout", self.hang_timeout))

    @classmethod
    def from_kwargs(cls, options: CheckpointOptions | None = None, **kwargs: Any) -> CheckpointOptions:
        """`options` (default: every field's default) with the fields named in `kwargs` replaced,
        checked; an unknown name is a `TypeError` naming it."""
        if options is not None and not isinstance(options, CheckpointOptions):
            raise ValueError(f"options must be a CheckpointOptions, got {type(options).__name__}.")
        unknown = sorted(set(kwargs) - set(OPTION_NAMES))
        if unknown:
            raise TypeError(f"unexpected keyword argument {unknown[0]!r}: neither an argument of this function "
                            f"nor a checkpoint option ({', '.join(OPTION_NAMES)}).")
        return dataclasses.replace(options if options is not None else cls(), **kwargs)


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(CheckpointOptions))


def option_docs() -> dict[str, str]:
    """Each checkpoint option's name and its doc (from `CheckpointOptions`' docstring), in order."""
    entries = _doc_entries(CheckpointOptions.__doc__ or "", "Attributes")
    return {name: entries.get(name, "") for name in OPTION_NAMES}


def takes_checkpoint_options(function: F) -> F:
    """`function`, which takes the checkpoint options as `**options`, with each field of
    `CheckpointOptions` as a keyword argument in its signature (its default and type) and in its
    docstring's `Args` (in place of the `**options` entry), for `help()`, `inspect.signature`
    and front ends that forward them."""
    signature = inspect.signature(function)
    own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    options = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
               for f in dataclasses.fields(CheckpointOptions)]
    function.__signature__ = signature.replace(parameters=[*own, *options])  # type: ignore[attr-defined]
    if function.__doc__ is not None:  # python -OO strips docstrings
        function.__doc__ = _with_option_docs(function.__doc__)
    return function


_ENTRY = re.compile(r"^(\s+)(\*{0,2}\w+): ?(.*)$")


def _doc_entries(doc: str, section: str) -> dict[str, str]:
    """The `name: text` entries of a Google-style docstring's `section`, each text on one line."""
    entries: dict[str, str] = {}
    inside, indent, name = False, None, None
    for line in inspect.cleandoc(doc).splitlines():
        if line.strip() == f"{section}:":
            inside = True
            continue
        match = _ENTRY.match(line) if inside else None
        if match and (indent is None or len(match[1]) == indent):
            indent, name = len(match[1]), match[2]
            entries[name] = match[3]
        elif inside and name is not None and line.strip() and len(line) - len(line.lstrip()) > (indent or 0):
            entries[name] += " " + line.strip()
        elif inside and line.strip() and not line.startswith(" "):
            break  # the next section
    return entries


def _with_option_docs(doc: str) -> str:
    """`doc` with its `**options` entry in `Args` replaced by one entry per checkpoint option,
    indented and wrapped like it."""
    lines = doc.splitlines()
    at = next((i for i, line in enumerate(lines) if line.lstrip().startswith("**") and ":" in line), None)
    if at is None:
        raise ValueError("a function taking checkpoint options documents them as `**options: ...` in its Args.")
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    end = at + 1
    while end < len(lines) and lines[end].strip() and len(lines[end]) - len(lines[end].lstrip()) > len(indent):
        end += 1
    entries = [line for name, text in option_docs().items() for line in _wrapped(f"{name}: {text}", indent)]
    return "\n".join([*lines[:at], *entries, *lines[end:]])


def _wrapped(text: str, indent: str, width: int = 100) -> list[str]:
    lines, line = [], indent
    for word in text.split():
        if len(line) + len(word) + 1 > width and line.strip():
            lines.append(line.rstrip())
            line = indent + "    "
        line += word + " "
    return [*lines, line.rstrip()]
