"""Print one table of every benchmark's checks (bench-results/*.json) and write summary.json."""

import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / "bench-results"


def main() -> int:
    rows: list[dict[str, Any]] = []
    for path in sorted(RESULTS.glob("*.json")):
        if path.name == "summary.json":
            continue
        data = json.loads(path.read_text())
        rows.extend(dict(check, bench=data.get("name", path.stem)) for check in data.get("checks", []))
    if not rows:
        print("No benchmark results in bench-results/; run a bench-* target first.")
        return 1
    print(f"\n{'figure':50} {'value':>12} {'unit':10} {'target':>18} {'ratio':>7}  ok")
    print("-" * 105)
    for row in rows:
        ratio = "" if row.get("ratio") is None else f"{row['ratio']:.2f}"
        print(
            f"{row['figure']:50} {row['value']:>12,.2f} {row['unit']:10} {row['target']:>18} {ratio:>7}  "
            f"{'yes' if row['ok'] else 'NO'}"
        )
    failed = [row for row in rows if not row["ok"]]
    (RESULTS / "summary.json").write_text(json.dumps({"checks": rows, "failed": len(failed)}, indent=2))
    print(f"\n{len(rows) - len(failed)} of {len(rows)} checks met; wrote bench-results/summary.json")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
