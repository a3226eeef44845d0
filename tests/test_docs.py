"""The docs stay true: the capability table in docs/capabilities.md is the one the code produces."""

import pathlib

from funcoll.report import capability_table

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_capability_table_matches_the_code():
    page = (ROOT / "docs" / "capabilities.md").read_text()
    assert capability_table() in page, "regenerate the table with: ./dev python -m funcoll.report"


def test_readme_has_the_two_commands_and_ci_calls_the_test_one():
    readme = (ROOT / "README.md").read_text()
    assert "./dev demo" in readme and "./dev test" in readme
    assert "exec ./dev test" in (ROOT / ".ci" / "run").read_text()
