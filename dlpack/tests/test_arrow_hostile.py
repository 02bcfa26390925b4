"""Hostile Arrow structs, each in a child process (``_arrow_hostile_cases``): a crash or a Rust
panic fails the cases from the one that crashed on, never the test run."""

from __future__ import annotations

import json
import re

import pytest

from ._helpers import need, run_python

need("pyarrow")
need("numpy")

from . import _arrow_hostile_cases as cases  # noqa: E402 - after the libraries it needs


def run_cases(*names, timeout):
    result = run_python("-m", "dlpack.tests._arrow_hostile_cases", *names, timeout=timeout)
    found = {}
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            outcome = json.loads(line)
            found[outcome.pop("case")] = outcome
    return found, result


@pytest.fixture(scope="module")
def outcomes():
    return run_cases(timeout=300)


@pytest.mark.parametrize("name", list(cases.CASES))
def test_hostile_struct_is_a_clear_error(outcomes, name):
    found, result = outcomes
    assert name in found, (
        f"the child died before this case (exit status {result.returncode}): "
        f"{result.stderr[-2000:]}"
    )
    raises, match, _ = cases.CASES[name]
    outcome = found[name]
    assert outcome["raised"] == raises, outcome
    assert re.search(match, outcome["message"]), outcome
    assert "panicked" not in result.stderr


def test_schemas_whose_nodes_are_shared_are_refused_at_once():
    # Walked node by node, 40 levels of shared children are 2**40 nodes, a walk that never ends:
    # the time limit fails the test where one is tried. Refused, the message stays short too.
    found, result = run_cases(*cases.SHARED, timeout=120)
    for name, (raises, match, _) in cases.SHARED.items():
        assert name in found, (name, result.returncode, result.stderr[-2000:])
        outcome = found[name]
        assert outcome["raised"] == raises and re.search(match, outcome["message"]), outcome
        assert len(outcome["message"]) < 500, outcome
    assert "panicked" not in result.stderr


def test_fuzzed_arrow_structs_are_read_or_refused_never_a_crash():
    # `python -m dlpack.tests._arrow_fuzz N` runs longer fuzzing by hand.
    result = run_python("-m", "dlpack.tests._arrow_fuzz", "400", timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "fuzzed 400 examples" in result.stdout and " read" in result.stdout, result.stdout
    assert "panicked" not in result.stderr
