"""Check dlcomm's layers: the import-linter contracts of ``.importlinter`` and no import cycle.

The adapters live in ``frameworks/<name>`` but are installed as ``dlcomm.<name>``, which a
static import graph of ``dlcomm/`` does not see. So this builds the installed layout in a
temporary folder (``dlcomm/`` with every entry linked, plus ``torch``, ``tensorflow`` and
``mxnet`` linked to ``frameworks/*``) and checks the contracts there, then looks for import
cycles (strongly connected modules, function-local imports included) in that whole graph.
``python tests/check_layers.py`` exits 1 on a broken contract or a cycle (``make lint``).
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ADAPTERS = ("torch", "tensorflow", "mxnet")


def installed_layout(into: Path) -> Path:
    """``into/dlcomm``: links to the checkout's ``dlcomm/`` entries and adapters."""
    package = into / "dlcomm"
    package.mkdir()
    for entry in (REPO / "dlcomm").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name in ADAPTERS:
        (package / name).symlink_to(REPO / "frameworks" / name)
    return into


def import_cycles(graph: object) -> list[list[str]]:
    """Groups of modules that import each other, directly or through others (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph.modules):  # type: ignore[attr-defined]
        if root in index:
            continue
        # Iterative depth-first search: (module, iterator over what it imports).
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(
                        child)))))
                elif child in on_stack:
                    low[module] = min(low[module], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == module:
                        break
                if len(group) > 1:
                    cycles.append(sorted(group))
    return cycles


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="dlcomm-layers-") as tmp:
        layout = installed_layout(Path(tmp))
        # The editable install maps `dlcomm` to the checkout; the linked layout must win.
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
        sys.path.insert(0, str(layout))
        sys.modules.pop("dlcomm", None)
        import grimp
        from importlinter.cli import lint_imports

        os.chdir(layout)  # import-linter puts the working folder first on sys.path
        code = lint_imports(config_filename=str(REPO / ".importlinter"), no_cache=True)
        graph = grimp.build_graph("dlcomm", include_external_packages=False, cache_dir=None)
        cycles = import_cycles(graph)
        for group in cycles:
            print(f"import cycle: {' <-> '.join(group)}")
        if not cycles:
            print(f"No import cycle among {len(graph.modules)} modules of dlcomm/ and "
                  "frameworks/.")
        return 1 if code or cycles else 0


if __name__ == "__main__":
    sys.exit(main())
