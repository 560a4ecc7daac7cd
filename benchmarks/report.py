"""Refresh the results table in benchmarks/README.md and the chart benchmarks/results.png.

Reads ``benchmarks/results/*.json`` (written by each benchmark's full run) and rewrites the
part of the README between the ``results`` markers. ``make bench`` runs it last. Not a
benchmark: it measures nothing.

    python benchmarks/report.py
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"
CHART = HERE / "results.png"
START, END = "<!-- results:start -->", "<!-- results:end -->"
LATEST = "Latest full run"
#: Benchmarks in the order of the table, with their scripts.
ORDER = [
    "publish_local",
    "publish_per_file",
    "publish_memory",
    "vs_spark_commit",
    "end_to_end",
    "end_to_end_connect",
    "recovery_parallel",
    "recovery_memory",
    "s3_publish",
    "object_store_rates",
    "table_publish",
    "table_contention",
    "durability_cost",
    "checks_cost",
    "postgres_concurrency",
    "restate_partition",
]


def load() -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted((HERE / "results").glob("*.json")):
        doc = json.loads(path.read_text())
        found[doc["name"]] = doc
    return found


def _value(r: dict[str, Any]) -> str:
    if r.get("unit") == "MiB":
        return f"{r['a_s']:.0f} MiB"
    if r.get("unit") == "µs/file":
        return f"{r['a_s']:.1f} / {r['b_s']:.1f} µs per file"
    return f"{r['a_s']:.3f} s / {r['b_s']:.3f} s"


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| benchmark | series | N | A / B (medians) | A÷B | rounds | goal | met |",
        "|---|---|---:|---|---:|---:|---|---|",
    ]
    for name in ORDER + sorted(set(results) - set(ORDER)):
        doc = results.get(name)
        if doc is None:
            lines.append(f"| {name} | see `{name}.py` | | not run here | | | | |")
            continue
        verdict = "yes" if doc["met"] else "**no**"
        verdict += f" (ratio={doc['ratio']:.2f})"
        for i, r in enumerate(doc["rows"]):
            last = i == len(doc["rows"]) - 1
            lines.append(
                f"| {name if i == 0 else ''} | {r['series']} | {r['n']:,} | {_value(r)} | "
                f"{r['ratio']:.3f} | {r['rounds']} | {doc['goal'] if last else ''} | "
                f"{verdict if last else ''} |"
            )
    when = max((d["when"] for d in results.values()), default="never")
    machine = next((d["machine"] for d in results.values()), "")
    lines.append("")
    lines.append(f"{LATEST}: {when} on {machine}. Chart: `results.png`.")
    return "\n".join(lines)


#: Panels of the chart in a row: one per benchmark, rows of this many.
CHART_COLUMNS = 4


def chart(results: dict[str, dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ORDER if n in results]
    if not names:
        return
    columns = min(len(names), CHART_COLUMNS)
    rows = -(-len(names) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.0 * columns, 3.4 * rows), squeeze=False)
    cells = [ax for row in axes for ax in row]
    for ax in cells[len(names) :]:
        ax.set_visible(False)
    for ax, name in zip(cells, names, strict=False):
        doc = results[name]
        series: dict[str, list[tuple[int, float]]] = {}
        memory = any(r.get("unit") == "MiB" for r in doc["rows"])
        for r in doc["rows"]:
            y = r["a_s"] if memory else r["ratio"]
            series.setdefault(r["series"], []).append((r["n"], y))
        for label, points in series.items():
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
        ax.set_xscale("log")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("N", fontsize=8)
        ax.set_ylabel("peak RSS (MiB)" if memory else "A ÷ B", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
        ax.grid(alpha=0.3)
    fig.suptitle("commitpub cost against N (A ÷ B; lower is better)", fontsize=10)
    fig.tight_layout()
    fig.savefig(CHART, dpi=80)
    plt.close(fig)


def inside_lines(text: str) -> list[str]:
    """The README's lines between the results markers."""
    return text.split(START, 1)[-1].split(END, 1)[0].splitlines()


def _previous_rows(text: str) -> dict[str, list[str]]:
    """The README's current table rows, grouped by benchmark (a group's later rows have an
    empty first cell)."""
    groups: dict[str, list[str]] = {}
    name = None
    for line in inside_lines(text)[3:]:
        if not line.startswith("|"):
            continue
        first = line.split("|")[1].strip()
        name = first or name
        if name is not None:
            groups.setdefault(name, []).append(line)
    return groups


def main() -> None:
    results = load()
    text = README.read_text()
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"{README} has no {START} ... {END} markers")
    # A benchmark without a result here (not run, or only a --quick smoke run) keeps the rows
    # the README has, so a partial run never erases figures measured before.
    previous = _previous_rows(text)
    lines = table(results).splitlines()
    kept = lines[:2]
    for line in lines[2:]:
        name = line.split("|")[1].strip() if line.startswith("|") else ""
        unmeasured = name and name not in results and name in previous
        if not results and line.startswith(LATEST):
            # Nothing measured here: the date and machine of the last full run stay.
            kept.extend([p for p in inside_lines(text) if p.startswith(LATEST)][:1] or [line])
            continue
        kept.extend(previous[name] if unmeasured else [line])
    README.write_text(pattern.sub(lambda _m: f"{START}\n" + "\n".join(kept) + f"\n{END}", text))
    missing = [name for name in ORDER if name not in results]
    if missing:
        print(f"chart left as it is: no results here for {', '.join(missing)}")
    else:
        chart(results)
    print(f"refreshed {README.name} from {len(results)} results")


if __name__ == "__main__":
    main()
