"""The docs say what the code does: the exit codes in `optkit --help`, the README and docs/ci.md are the one list in
optkit.core.errors."""
from __future__ import annotations

import pytest

from optkit.core.errors import EXIT_CODES, exit_code_table, exit_codes_line

from conftest import ROOT, run_cli


@pytest.mark.parametrize("page", ["README.md", "docs/ci.md"])
def test_the_exit_code_tables_are_the_one_list(page):
    assert exit_code_table() in (ROOT / page).read_text(), f"{page}: paste optkit.core.errors.exit_code_table()"


def test_help_lists_every_exit_code():
    r = run_cli("--help")
    assert r.rc == 0
    text = " ".join(r.out.split())
    assert exit_codes_line() in text
    assert {code for code, _, _ in EXIT_CODES} == {0, 1, 2, 3, 4, 130, 141, 143}
