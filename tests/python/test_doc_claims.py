"""Statements of the docs, the help and the R help pages, held against what the code does."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest

import kerasdist
from kerasdist.checkpoint import CheckpointWarning
from kerasdist.launch import INTERRUPTED_EXIT_CODE, TIMEOUT_EXIT_CODE
from kerasdist_cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def _commands() -> list[str]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return list(sub.choices)


def _section(text: str, start: str) -> str:
    return text.split(start, 1)[1].split("\n## ", 1)[0]


def test_the_cli_synopsis_and_the_guides_index_list_every_command():
    cli = (ROOT / "docs" / "cli.md").read_text()
    synopsis = cli.split("```sh", 1)[1].split("```", 1)[0]
    index_row = next(line for line in (ROOT / "docs" / "index.md").read_text().splitlines()
                     if line.startswith("| [Command line]"))
    for command in _commands():
        assert f"kerasdist {command} " in synopsis, command
        assert f"## `{command}`" in cli, command
        assert f"{command}`" in index_row, command


def _statuses(text: str) -> set[int]:
    text = re.sub(r"128 ?\+ ?N", "", text)
    return {int(n) for n in re.findall(r"(?<![+\w-])(\d+)(?![+\w])", text)}


def test_launch_exit_statuses_in_the_help_and_cli_guide_are_the_ones_the_code_returns(tmp_path, capsys):
    launch = build_parser()._subparsers._group_actions[0].choices["launch"]
    help_statuses = _statuses(launch.epilog.split("exit status:", 1)[1].split("example", 1)[0])
    guide = _section((ROOT / "docs" / "cli.md").read_text(), "## `launch`")
    guide_statuses = _statuses(guide.split("Exit status:", 1)[1].split("See", 1)[0])
    expected = {0, 2, TIMEOUT_EXIT_CODE, INTERRUPTED_EXIT_CODE}
    assert help_statuses == expected
    assert guide_statuses == expected

    # the ones a run returns without TensorFlow in the tasks: bad input, a task never up
    assert main(["launch", "-n", "1"]) == 2
    assert main(["launch", "-n", "1", "--startup-timeout", "0.5", "--", "sleep", "30"]) == TIMEOUT_EXIT_CODE
    assert "did not come up within" in capsys.readouterr().err


def _rd_item(rd: str, name: str) -> str:
    text = (ROOT / "man" / f"{rd}.Rd").read_text()
    item = text.split(f"\\item{{{name}}}{{", 1)[1].split("\n\n", 1)[0]
    return " ".join(item.split())  # as read: roxygen wraps lines wherever the text's length puts them


def test_what_the_r_help_says_of_checkpoint_dir_is_what_the_readers_do(tmp_path):
    missing = tmp_path / "none" / "here"
    for rd in ("latest_checkpoint", "list_checkpoints", "checkpoint_table", "goodput"):
        item = _rd_item(rd, "checkpoint_dir")
        assert "created if missing" not in item, rd
        assert "never created" in item, rd
    assert "an error naming it" in _rd_item("checkpoint_table", "checkpoint_dir")
    assert "\\code{NULL}" in _rd_item("latest_checkpoint", "checkpoint_dir")
    assert "no rows" in _rd_item("list_checkpoints", "checkpoint_dir")

    assert kerasdist.latest_checkpoint(str(missing)) is None
    assert kerasdist.list_checkpoints(str(missing)) == []
    for reader in (kerasdist.checkpoint_table, kerasdist.goodput):
        with pytest.raises(ValueError, match="checkpoint_dir"):
            reader(str(missing))
    assert not missing.parent.exists()
    # the one that does create it says so
    assert "created if missing" in _rd_item("make_or_restore_model", "checkpoint_dir")


def _small_model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


@pytest.mark.parametrize("bad, message", [
    (dict(y=np.zeros(7, "float32")), "y"),
    (dict(batch_size=0), "batch_size"),
    (dict(dataset_args={"shuffle_buffer": 0}), "shuffle_buffer"),
])
def test_distributed_fit_refuses_bad_arguments_before_any_checkpoint_is_read(tmp_path, bad, message):
    """A damaged checkpoint warns when it is read: a refused call must not have read it."""
    damaged = tmp_path / "ckpt" / "ckpt-4"
    damaged.mkdir(parents=True)
    (damaged / "state.json").write_text("{ not json")
    (damaged / "model.keras").write_bytes(b"garbage")
    args = dict(x=np.zeros((16, 4), "float32"), y=np.zeros(16, "float32"), batch_size=4)
    args.update(bad)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=message):
            kerasdist.distributed_fit(_small_model, epochs=1, checkpoint_dir=str(tmp_path / "ckpt"),
                                      strategy="default", verbose=0, **args)
    assert not [w for w in seen if issubclass(w.category, CheckpointWarning)]


def test_the_table_of_defaults_in_the_training_guide_is_what_the_functions_take():
    import inspect

    from kerasdist.strategy import DEFAULT_PEER_TIMEOUT

    guide = _section((ROOT / "docs" / "training.md").read_text(), "## Defaults")
    rows = re.findall(r"^\| `(\w+)\((\w+)=\)` \| `([^`]+)` \|", guide, re.M)
    assert len(rows) >= 10
    for function, argument, documented in rows:
        default = inspect.signature(getattr(kerasdist, function)).parameters[argument].default
        assert documented == (f'"{default}"' if isinstance(default, str) else repr(default)), (function, argument)
    assert f"| `KERASDIST_PEER_TIMEOUT` | `{DEFAULT_PEER_TIMEOUT:g}` |" in guide


# -- what RELIABILITY.md and the guides say of the tests and the set-up --------------------------

def _collected(path: Path) -> int:
    """How many tests pytest collects from `path`: each test function, times the length of each of
    its `parametrize` lists (written out as lists in these files)."""
    import ast

    count = 0
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            cases = 1
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith("mark.parametrize"):
                    values = decorator.args[1]
                    assert isinstance(values, (ast.List, ast.Tuple)), f"{path.name}:{node.name}: count it by hand"
                    cases *= len(values.elts)
            count += cases
    return count


def test_the_test_counts_reliability_gives_are_the_files():
    text = (ROOT / "RELIABILITY.md").read_text()
    for name in ("test_slurm.py", "test_chaos.py"):
        stated = re.search(rf"{name}` \((\d+) tests", text)
        assert stated, f"RELIABILITY.md no longer counts {name}'s tests: drop this check or the count"
        assert int(stated.group(1)) == _collected(ROOT / "tests" / "python" / name), name


def test_the_slurm_tests_flags_and_pace_are_what_reliability_says():
    import ast

    text = _section((ROOT / "RELIABILITY.md").read_text(), "## Slurm: preemption at any instant")
    source = (ROOT / "tests" / "python" / "test_slurm.py").read_text()
    tree = ast.parse(source)
    flags = re.search(r"^\| time-limit warning \| `([^`]+)` \|", text, re.M).group(1).split()
    timed = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and "time_limit" in node.name)
    options = [ast.literal_eval(keyword.value) for node in ast.walk(timed) if isinstance(node, ast.Call)
               for keyword in node.keywords if keyword.arg == "options"]
    assert options == [flags]
    pace = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", "") == "PACE")
    stated = [float(s) for s in re.search(r"land inside training \(([\d.]+) s; ([\d.]+) s in the time-limit "
                                          r"test, ([\d.]+) s in the lost-host ones\)", " ".join(text.split())).groups()]
    others = {ast.literal_eval(keyword.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
              for keyword in node.keywords if keyword.arg == "step_seconds" and isinstance(keyword.value, ast.Constant)}
    assert stated[0] == pace and set(stated[1:]) == others - {0}


def test_the_checkpoint_cases_reliability_counts_are_the_table():
    import json

    text = (ROOT / "RELIABILITY.md").read_text()
    stated = re.search(r"(\d+) rows \((\d+) `damage`, (\d+) `errors`, (\d+) `object_damage`\)", text).groups()
    cases = json.loads((ROOT / "tests" / "cases" / "checkpoint.json").read_text())
    counts = [len(cases[kind]) for kind in ("damage", "errors", "object_damage")]
    assert [int(n) for n in stated] == [sum(counts), *counts]


def test_pandoc_is_set_up_for_make_test_only_and_the_vignettes_are_built_by_r_cmd_build():
    setup = (ROOT / "tools" / "setup.sh").read_text()
    packages = {name: re.search(rf'^{name}="([^"]*)"', setup, re.M | re.S).group(1).split()
                for name in ("DEMO_DEBIAN_PACKAGES", "TEST_DEBIAN_PACKAGES")}
    assert "pandoc" in packages["TEST_DEBIAN_PACKAGES"] and "pandoc" not in packages["DEMO_DEBIAN_PACKAGES"]
    assert "pandoc (for `make test`" in " ".join((ROOT / "docs" / "install.md").read_text().split())
    test_sh = (ROOT / "tools" / "test.sh").read_text()
    assert "R CMD check --no-manual --ignore-vignettes" in test_sh  # the build runs them, the check not
    assert "`vignettes/` (R, built by R CMD build)" in (ROOT / "ARCHITECTURE.md").read_text()


def test_the_guides_write_the_kerasdist_command_and_the_cli_guide_says_once_what_python_m_is():
    """The guides, the R help pages and what `make demo` prints name the users' command,
    `kerasdist ...`; docs/cli.md says once that `python -m kerasdist` is the same."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "R").glob("*.R")),
             *sorted((ROOT / "man").glob("*.Rd"))]
    lines = [(page.name, n, line) for page in pages for n, line in enumerate(page.read_text().splitlines(), 1)]
    lines += [("Makefile", n, line) for n, line in enumerate((ROOT / "Makefile").read_text().splitlines(), 1)
              if line.strip().startswith("@echo")]
    spelled = [f"{name}:{n}" for name, n, line in lines
               if re.search(r"python -m kerasdist(?!_cli)\b", line) and name != "cli.md"]
    assert spelled == []
    cli = " ".join((ROOT / "docs" / "cli.md").read_text().split())
    assert cli.count("python -m kerasdist COMMAND") == 1 and "is the same command" in cli
