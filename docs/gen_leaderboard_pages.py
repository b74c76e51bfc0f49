"""Generate one page per committed leaderboard (run by the mkdocs-gen-files plugin).

Every ``leaderboards/<name>/`` folder of the repository holds the output of one real
``selfcest suite`` run: ``README.md`` (the command and what the numbers show),
``leaderboard.csv`` and ``plots/``. Its page, ``leaderboards/<name>.md``, is that README, the
main columns of the CSV as a table and the PNG plots, so the measured figures on the site are
always the committed ones, next to the command that produced them. ``leaderboards/SUMMARY.md``
lists the pages after the hand-written ``leaderboards/index.md``.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import mkdocs_gen_files

REPO = Path(mkdocs_gen_files.config.config_file_path).resolve().parent
LEADERBOARDS = REPO / "leaderboards"
PAGES = Path("leaderboards")

# (CSV column, table heading, format)
COLUMNS = (
    ("env_id", "env", "{}"),
    ("source", "source", "{}"),
    ("variant", "variant", "{}"),
    ("agent", "agent", "{}"),
    ("budget", "budget", "{}"),
    ("n", "n", "{}"),
    ("accuracy", "accuracy", "{:.3f}"),
    ("acc_ci_low", "95% CI low", "{:.3f}"),
    ("acc_ci_high", "95% CI high", "{:.3f}"),
    ("gen_tokens_mean", "gen tokens", "{:.1f}"),
    ("critical_path_tokens_mean", "critical path", "{:.1f}"),
    ("peak_context_tokens_mean", "peak context", "{:.1f}"),
)
PARETO = ("pareto_gen_tokens", "pareto_critical_path_tokens", "pareto_peak_context_tokens")


def cell(row: dict[str, str], column: str, fmt: str) -> str:
    value = row.get(column, "")
    if fmt != "{}":
        try:
            number = float(value)
        except ValueError:
            return value
        return fmt.format(number) if math.isfinite(number) else value
    return value.replace("|", "\\|")


def table(csv_path: Path) -> list[str]:
    with csv_path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        return []
    columns = [c for c in COLUMNS if c[0] in rows[0]]
    pareto = [p for p in PARETO if p in rows[0]]
    headings = [c[1] for c in columns] + (["Pareto (gen / critical / peak)"] if pareto else [])
    lines = [
        "| " + " | ".join(headings) + " |",
        "|" + " --- |" * len(headings),
    ]
    order = ("env_id", "source", "variant", "agent")
    rows.sort(key=lambda r: tuple(r.get(column, "") for column in order))
    for row in rows:
        cells = [cell(row, column, fmt) for column, _, fmt in columns]
        if pareto:
            flags = ["yes" if row[p].strip().lower() == "true" else "no" for p in pareto]
            cells.append(" / ".join(flags))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def page(folder: Path) -> str:
    name = folder.name
    readme = folder / "README.md"
    lines = [readme.read_text(encoding="utf-8").rstrip(), ""] if readme.is_file() else [f"# {name}"]
    lines += [
        "",
        "!!! note",
        f"    This page is built from `leaderboards/{name}/` of the repository: its README,",
        "    its `leaderboard.csv` and its plots, as committed.",
        "",
    ]
    csv_path = folder / "leaderboard.csv"
    if csv_path.is_file():
        lines += ["## The leaderboard", "", *table(csv_path), ""]
    plots = sorted((folder / "plots").glob("*.png"))
    if plots:
        lines += ["## The plots", ""]
        for plot in plots:
            target = PAGES / name / "plots" / plot.name
            with mkdocs_gen_files.open(target, "wb") as out:
                out.write(plot.read_bytes())
            lines += [f"![{plot.stem}]({name}/plots/{plot.name})", ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    summary = ["* [Leaderboards and suites](index.md)\n"]
    for folder in sorted(p for p in LEADERBOARDS.iterdir() if p.is_dir()):
        with mkdocs_gen_files.open(PAGES / f"{folder.name}.md", "w") as out:
            out.write(page(folder))
        summary.append(f"* [The {folder.name} suite]({folder.name}.md)\n")
    with mkdocs_gen_files.open(PAGES / "SUMMARY.md", "w") as out:
        out.writelines(summary)


main()
