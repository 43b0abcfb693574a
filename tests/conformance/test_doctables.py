"""Numbers in the docs come from the code: the generated tables are current.

Regression gate: the tables are compared with what conformance/report/doctables.py computes now from
``case_list``; the independent part is the count of one profile's cases by tier, summed here.
"""

from pathlib import Path

from conformance.report import doctables
from conformance.cases.suite import TIERS, case_list

ROOT = Path(__file__).resolve().parents[2]


def test_generated_tables_in_the_docs_are_current():
    assert doctables.stale(ROOT) == [], "run: python -m conformance.report.doctables --write"


def test_case_count_table_adds_up():
    text = (ROOT / "docs" / "conformance.md").read_text()
    row = next(l for l in text.splitlines() if l.startswith("| `ci` |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    per_tier = [int(c) for c in cells[3:3 + len(TIERS)]]
    assert sum(per_tier) == int(cells[-1]) == len(case_list(profile="ci"))
    assert per_tier[TIERS.index("golden")] == len(case_list(tiers=("golden",), profile="ci")) > 0


def test_stale_table_is_named(tmp_path):
    (tmp_path / "docs").mkdir()
    text = (ROOT / "docs" / "conformance.md").read_text().replace("| `ci` |", "| `ci` | 9999 |", 1)
    (tmp_path / "docs" / "conformance.md").write_text(text)
    assert doctables.stale(tmp_path) == ["docs/conformance.md"]


def test_no_typed_case_counts_in_readme():
    readme = (ROOT / "README.md").read_text()
    n = str(len(case_list(profile="ci")))
    assert n not in readme, "the README types the ci case count; link the generated table instead"
