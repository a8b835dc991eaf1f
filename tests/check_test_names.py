"""Lint: test file basenames are unique under tests/. pytest imports test files by basename
(tests/ holds no packages), so two files of the same name in different folders stop the
whole run at collection with an import-file-mismatch error; this names them first."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path


def main() -> int:
    tests = Path(__file__).resolve().parent
    counts = Counter(p.name for p in tests.rglob("test_*.py"))
    clashes = sorted(name for name, n in counts.items() if n > 1)
    if clashes:
        print(f"test files share a basename (rename one of each): {clashes}")
        return 1
    print(f"{sum(counts.values())} test files, basenames unique")
    return 0


if __name__ == "__main__":
    sys.exit(main())
