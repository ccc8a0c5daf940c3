"""The public boundary is written out: every public function's keywords stand in its own signature
(none taken through `**kwargs`, none added at import), each option's default is defined once (in
its record; a signature names it, `keep: int = CheckpointOptions.keep`), each is documented once
(in its record), and the R wrappers take the same keywords with the same defaults. No training."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import re
import textwrap
from pathlib import Path

import pytest

import kerasdist
from kerasdist.checkpoint import CheckpointOptions
from kerasdist.data import DatasetOptions
from kerasdist.training.speed import TrainingSettings

ROOT = Path(__file__).resolve().parents[2]

# Which public function takes which record's fields flat (each field a keyword), and which not.
TAKERS = [
    (kerasdist.checkpoint_callback, CheckpointOptions, ()),
    (kerasdist.CheckpointCallback.__init__, CheckpointOptions, ()),
    (kerasdist.distributed_fit, CheckpointOptions, ()),
    (kerasdist.custom_fit, CheckpointOptions, ()),
    (kerasdist.distributed_fit, TrainingSettings, ()),
    (kerasdist.custom_fit, TrainingSettings, ("steps_per_execution",)),
    (kerasdist.make_dataset, DatasetOptions, ("validation_split",)),
    (kerasdist.make_dataset_split, DatasetOptions, ("validation_split",)),  # its own: required
    (kerasdist.plan_dataset, DatasetOptions, ()),
    # distributed_fit shapes the data through these; the others through dataset_args
    (kerasdist.distributed_fit, DatasetOptions,
     tuple(f.name for f in dataclasses.fields(DatasetOptions)
           if f.name not in ("batch_size", "per_replica_batch_size", "seed", "shuffle", "sample_weight",
                             "validation_split"))),
]


def _public_callables():
    """The public functions of kerasdist and kerasdist.checkpoint, and their classes' __init__ and
    public methods (those the classes define themselves)."""
    for module in (kerasdist, kerasdist.checkpoint):
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) and not issubclass(value, BaseException):
                yield name, value.__init__
                yield from ((f"{name}.{method}", function) for method, function in vars(value).items()
                            if inspect.isfunction(function) and not method.startswith("_"))
            elif inspect.isfunction(value):
                yield name, value


def test_no_public_function_takes_catch_all_keywords_or_has_its_signature_rewritten():
    """What a function takes is what its source says: help(), IDEs and type checkers see it."""
    for name, function in _public_callables():
        if function is object.__init__:
            continue
        kinds = {p.kind for p in inspect.signature(function).parameters.values()}
        assert inspect.Parameter.VAR_KEYWORD not in kinds, f"{name} takes **kwargs"
        assert "__signature__" not in vars(function), f"{name}'s signature is rewritten at import"


@pytest.mark.parametrize(("function", "record", "not_taken"), TAKERS,
                         ids=lambda value: getattr(value, "__qualname__", ""))
def test_a_function_takes_each_field_of_its_record_with_the_records_default_and_doc(function, record, not_taken):
    parameters = inspect.signature(function).parameters
    doc = inspect.getdoc(function)
    for field in dataclasses.fields(record):
        if field.name in not_taken:
            continue
        parameter = parameters[field.name]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, field.name
        assert parameter.default is field.default or (
            type(parameter.default) is type(field.default) and parameter.default == field.default), field.name
        assert doc.count(f"\n    {field.name}: ") == 1, field.name
    assert f"{record.__name__}: " not in doc


def _defaults_in_source(function) -> dict[str, ast.expr]:
    """The default expressions of `function`'s keyword-only parameters, as written in its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    return {arg.arg: default for arg, default in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)
            if default is not None}


@pytest.mark.parametrize(("function", "record", "not_taken"), TAKERS,
                         ids=lambda value: getattr(value, "__qualname__", ""))
def test_each_default_is_defined_once_in_the_record_and_named_by_the_signature(function, record, not_taken):
    """`keep: int = CheckpointOptions.keep`, never a second literal that could drift from it."""
    written = _defaults_in_source(function)
    for field in dataclasses.fields(record):
        if field.name in not_taken:
            continue
        assert ast.unparse(written[field.name]) == f"{record.__name__}.{field.name}", field.name


def test_select_strategy_takes_plan_strategys_signals_with_their_defaults():
    plan = inspect.signature(kerasdist.plan_strategy).parameters
    select = inspect.signature(kerasdist.select_strategy).parameters
    for name in ("kind", "devices", "tf_config", "cluster_resolver", "environ", "gpus", "tpu"):
        assert select[name].default == plan[name].default, name
        assert select[name].kind is plan[name].kind, name


def test_a_record_given_whole_and_flat_keywords_make_the_same_options(tmp_path):
    flat = kerasdist.checkpoint_callback(tmp_path, keep=5, every_steps=2, async_save=False)
    whole = kerasdist.checkpoint_callback(tmp_path, options=CheckpointOptions(keep=5, every_steps=2,
                                                                               async_save=False))
    assert flat.options == whole.options == CheckpointOptions(keep=5, every_steps=2, async_save=False)
    both = kerasdist.checkpoint_callback(tmp_path, options=CheckpointOptions(keep=5), every_steps=2)
    assert (both.options.keep, both.options.every_steps) == (5, 2)  # a keyword at its default keeps the record's
    assert kerasdist.CheckpointCallback(tmp_path, CheckpointOptions(keep=4), keep=2).options.keep == 2


# -- R: the same keywords, the same defaults -------------------------------------------------------

# An R argument whose Python name differs, per R function, and why.
R_NAMES = {
    "make_dataset": {"repeat_epochs": "repeat"},  # `repeat` is a reserved word in R
    "make_dataset_split": {"repeat_epochs": "repeat"},
    "plan_dataset": {"repeat_epochs": "repeat"},
    "checkpoint_manager": {"checkpoint_dir": "directory"},  # the name every other R function uses
}
# Python arguments an R wrapper leaves out, and why.
PYTHON_ONLY = {
    "checkpoint_callback": {"options"},  # a CheckpointOptions record: R names the options themselves
}


def _r_formals(source: str, function: str) -> dict[str, str | None]:
    """`function`'s arguments in an R file and their default expressions (None: no default)."""
    start = re.search(rf"^{re.escape(function)} <- function\(", source, re.M)
    assert start, function
    depth, at = 1, start.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(source[at], 0)
        at += 1
    formals, depth, current = {}, 0, ""
    for char in source[start.end():at - 1] + ",":
        if char == "," and depth == 0:
            name, equals, default = current.partition("=")
            formals[name.strip()] = default.strip() if equals else None
            current = ""
            continue
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(char, 0)
        current += char
    return formals


def _r_value(text: str | None):
    """An R default expression as the Python value it stands for (NULL, TRUE, 3L, "auto", 0.5)."""
    if text is None:
        return inspect.Parameter.empty
    constants = {"NULL": None, "TRUE": True, "FALSE": False}
    if text in constants:
        return constants[text]
    if re.fullmatch(r"-?\d+L", text):
        return int(text[:-1])
    if re.fullmatch(r'"[^"]*"', text):
        return text[1:-1]
    if re.fullmatch(r"-?\d+(\.\d*)?(e-?\d+)?", text):
        return float(text)
    return ("an R expression", text)


def _r_wrappers():
    overrides = json.loads((ROOT / "tools" / "r_docs.json").read_text())
    for r_file, wrappers in overrides.items():
        if r_file.startswith("_"):
            continue
        for function, spec in wrappers.items():
            yield r_file, function, spec["python"]


def _python_object(spec: str):
    path, name = spec.split(":")
    module = path.removeprefix("python/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize(("r_file", "function", "python"), list(_r_wrappers()), ids=lambda v: v if "/" not in v else "")
def test_an_r_wrapper_takes_its_python_twins_keywords_with_the_same_defaults(r_file, function, python):
    """R's literal defaults are tied to Python's here: a default changed on one side fails until
    the other follows."""
    r = _r_formals((ROOT / r_file).read_text(), function)
    renamed = R_NAMES.get(function, {})
    r = {renamed.get(name, name): default for name, default in r.items()}
    parameters = {name: p for name, p in inspect.signature(_python_object(python)).parameters.items()
                  if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    assert "..." not in r, f"{function}(...) takes what it does not name"
    assert set(parameters) - set(r) == PYTHON_ONLY.get(function, set()), f"{function} lacks Python keywords"
    assert set(r) - set(parameters) == set(), f"{function} has arguments its Python twin lacks"
    for name, default in r.items():
        expected, given = parameters[name].default, _r_value(default)
        same = given is expected or (given == expected and not isinstance(expected, bool))
        assert same, f"{function}({name} = {default}): Python's default is {expected!r}"
