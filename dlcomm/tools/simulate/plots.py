"""Figures of the simulator (matplotlib, imported only when a figure is drawn)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _pyplot():  # noqa: ANN202 - matplotlib is an optional dependency (the bench extra)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw(spec: Mapping[str, Any], path: str) -> None:
    """Draw a figure described by ``spec`` (``kind``: ``lines``, ``bars`` or ``barh``, as
    the seeds and the CLI build them) to ``path``."""
    plt = _pyplot()
    kind = spec["kind"]
    if kind == "lines":
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for label, points in spec["series"].items():
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", label=label)
        if spec.get("logx"):
            ax.set_xscale("log", base=2)
        if spec.get("logy"):
            ax.set_yscale("log")
        ax.set_xlabel(spec["xlabel"])
        ax.legend(fontsize=7)
    elif kind == "bars":
        groups: Mapping[str, Mapping[str, float]] = spec["groups"]
        names = list(next(iter(groups.values())))
        fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups) * len(names) / 3), 4.2))
        width = 0.8 / len(names)
        for j, name in enumerate(names):
            xs = [i + j * width for i in range(len(groups))]
            ax.bar(xs, [groups[g][name] for g in groups], width, label=name)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], list(groups))
        ax.legend(fontsize=7)
    elif kind == "barh":
        values: Mapping[str, float] = spec["values"]
        fig, ax = plt.subplots(figsize=(7, 0.6 * len(values) + 1.5))
        ax.barh(range(len(values)), list(values.values()))
        ax.set_yticks(range(len(values)), list(values), fontsize=7)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel(spec["xlabel"])
    else:
        raise ValueError(f"unknown figure kind {kind!r}")
    if "ylabel" in spec:
        ax.set_ylabel(spec["ylabel"])
    ax.set_title(spec["title"], fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def predicted_vs_measured(rows: Sequence[Mapping[str, Any]], path: str,
                          title: str = "simulated against measured time per iteration") -> None:
    """Scatter of predicted against measured seconds with the +-15% band (validation)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    measured = [r["measured_s"] * 1e3 for r in rows]
    predicted = [r["predicted_s"] * 1e3 for r in rows]
    top = max(measured + predicted) * 1.1
    ax.plot([0, top], [0, top], color="black", linewidth=0.8)
    ax.fill_between([0, top], [0, 0.85 * top], [0, 1.15 * top], color="grey", alpha=0.2,
                    label="within 15%")
    for hosts in sorted({r["hosts"] for r in rows}):
        pts = [(m, p) for r, m, p in zip(rows, measured, predicted) if r["hosts"] == hosts]
        ax.scatter(*zip(*pts), label=f"{hosts} hosts", s=18)
    ax.set_xlabel("measured ms per iteration")
    ax.set_ylabel("predicted ms per iteration")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
