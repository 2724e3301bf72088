"""Every planted bug of ``tests/mutations.py`` still plants into the code it names: its text is
found exactly once in its file. Code that moves leaves a planted bug stale, which the mutation
run reports but no test failed on (four had gone stale before this check)."""

from __future__ import annotations

import pytest

from tests.mutations import MUTATIONS, REPO


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_the_planted_bug_finds_its_text_once(mutation) -> None:
    text = (REPO / mutation.path).read_text()
    assert text.count(mutation.old) == 1, (
        f"{mutation.name}: its text is in {mutation.path} {text.count(mutation.old)} times"
    )
    for test in mutation.tests:
        assert (REPO / test.split("::")[0]).exists(), f"{mutation.name}: no {test}"
