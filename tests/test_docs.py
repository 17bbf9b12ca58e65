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


def test_the_readme_is_a_page_a_newcomer_can_hold():
    """At most 300 lines; the commands table in one-line cells naming every command `optkit --help` lists."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    rows = [line for line in text.splitlines() if line.startswith("| `optkit ")]
    assert rows and all(len(line) <= 220 for line in rows), [line[:80] for line in rows if len(line) > 220]
    r = run_cli("--help")
    commands = {line.split()[0] for line in r.out.split("Commands:")[1].splitlines() if line.strip()}
    named = {row.split("`optkit ")[1].split()[0].rstrip("`") for row in rows}
    assert commands <= named, f"commands missing from the README's table: {sorted(commands - named)}"


def test_internals_names_every_package():
    """docs/internals.md says what each package under optkit/ is for (by its path, e.g. `passes/tune/`)."""
    text = (ROOT / "docs" / "internals.md").read_text()
    packages = sorted(str(p.parent.relative_to(ROOT / "optkit")) for p in (ROOT / "optkit").rglob("__init__.py")
                      if p.parent != ROOT / "optkit")
    missing = [p for p in packages if f"{p}/" not in text]
    assert missing == [], f"packages docs/internals.md does not name (as `{{path}}/`): {missing}"


def test_links_between_the_pages_lead_somewhere():
    """Every relative link in the README and docs/ names a file that exists, and an anchor a heading it has."""
    import re

    def anchors(page):
        heads = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
        return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in heads}

    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path) if path else page
            if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []
