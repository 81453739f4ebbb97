"""A/B in one run (``make bench-ab BASELINE=<git rev>``): the same workloads of bench/run.py
against this checkout (B) and against ``--baseline`` (A, exported from git into a temporary
directory), alternating A, B, A, B ... for ``--rounds`` rounds so both meet the same machine
load, then each figure's median per side and the ratio B / A.

    python bench/ab.py --baseline 8f3c32c [--rounds 3] [--workloads W3] [--quick]

Each round is one ``bench/run.py`` process on a fresh database. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# A row of run.py's table: "| label | 12,345 jobs/s (...) |"; the first number is the figure,
# or the first numbers when the row gives several ("4.7 / 7.9 / 11.4 ms") and its label names
# as many ("p50 / p95 / p99"): one figure each.
FIGURE = re.compile(r"^\|\s*(?P<label>.+?)\s*\|\s*(?P<values>[\d,]+(?:\.\d+)?"
                    r"(?:\s*/\s*[\d,]+(?:\.\d+)?)*)")
NAMES = re.compile(r"\S+(?: / \S+)+")


def export(rev: str, into: Path) -> None:
    """``rev``'s django_xjobs package (and its tests package, for the dev database helper)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "django_xjobs", "tests"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


def run(source: Path, passthrough: list[str]) -> dict[str, float]:
    """One bench/run.py process measuring ``source``; its figures by label (first number)."""
    out = subprocess.run([sys.executable, str(HERE / "run.py"), "--source", str(source),
                          *passthrough], check=True, capture_output=True, text=True).stdout
    figures: dict[str, float] = {}
    for line in out.splitlines():
        m = FIGURE.match(line)
        if m:
            label = m["label"].strip()
            values = [float(v.replace(",", "")) for v in re.split(r"\s*/\s*", m["values"])]
            names = NAMES.search(label)
            if len(values) > 1 and names and len(names[0].split(" / ")) == len(values):
                for name, value in zip(names[0].split(" / "), values, strict=True):
                    figures[label.replace(names[0], name)] = value
            else:
                figures[label] = values[0]
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--baseline", required=True, help="git revision measured as A")
    p.add_argument("--rounds", type=int, default=3)
    args, passthrough = p.parse_known_args()
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="xjobs-ab-") as tmp:
        base = Path(tmp)
        try:
            export(args.baseline, base)
        except subprocess.CalledProcessError as exc:
            p.error(f"cannot export {args.baseline!r}: {exc.stderr.decode().strip()}")
        sides: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
        for i in range(args.rounds):
            for side, source in (("A", base), ("B", ROOT)):
                print(f"round {i + 1}/{args.rounds}: {side}", file=sys.stderr)
                sides[side].append(run(source, passthrough))
    labels = [k for k in sides["B"][0] if all(k in r for r in sides["A"] + sides["B"])]
    width = max(len(k) for k in labels) if labels else 10
    print(f"{'figure':<{width}}  {'A ' + args.baseline[:10]:>16}  {'B this tree':>14}  B / A")
    for label in labels:
        a = statistics.median(r[label] for r in sides["A"])
        b = statistics.median(r[label] for r in sides["B"])
        ratio = f"{b / a:.3f}" if a else "-"
        print(f"{label:<{width}}  {a:>16,.2f}  {b:>14,.2f}  {ratio}")


if __name__ == "__main__":
    main()
