"""Assign a round's clients to ranks so the round ends as early as possible.

Each rank trains its clients one after another, so a round lasts as long as the busiest rank
(the makespan). ``schedule_clients`` solves this as scheduling on uniform machines (a rank
with speed s finishes work w in w / s): longest processing time first (each client, largest
first, to the rank where it would finish earliest), then a local search that moves or swaps
clients off the busiest rank while that shortens it. ``static`` is the naive split Parrot
improves on: the sampled order cut into equal-count pieces.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SCHEDULERS = ("lpt", "static")
_MAX_PASSES = 200


def _check(work: Sequence[float], speeds: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    w = np.asarray(work, dtype=np.float64)
    s = np.asarray(speeds, dtype=np.float64)
    if w.ndim != 1 or (w.size and not np.all(np.isfinite(w))) or np.any(w < 0):
        raise ValueError("work must be a 1-D sequence of finite numbers >= 0")
    if s.ndim != 1 or s.size == 0 or not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise ValueError("speeds must be a non-empty 1-D sequence of finite numbers > 0 "
                         "(one per rank)")
    return w, s


def makespan(assignment: Sequence[Sequence[int]], work: Sequence[float],
             speeds: Sequence[float]) -> float:
    """The busiest rank's time: max over ranks of (its clients' work) / (its speed)."""
    w, s = _check(work, speeds)
    return max((float(w[list(jobs)].sum()) / s[r] if len(jobs) else 0.0)
               for r, jobs in enumerate(assignment))


def ideal_makespan(work: Sequence[float], speeds: Sequence[float]) -> float:
    """A lower bound no schedule beats: the work spread perfectly over the ranks' speed, or
    the largest client on the fastest rank, whichever is longer."""
    w, s = _check(work, speeds)
    if w.size == 0:
        return 0.0
    return max(float(w.sum() / s.sum()), float(w.max() / s.max()))


def _lpt(w: np.ndarray, s: np.ndarray) -> list[list[int]]:
    loads = np.zeros(s.size)
    out: list[list[int]] = [[] for _ in range(s.size)]
    for j in np.argsort(-w, kind="stable"):
        r = int(np.argmin((loads + w[j]) / s))
        loads[r] += w[j]
        out[r].append(int(j))
    return out


def _improve(out: list[list[int]], w: np.ndarray, s: np.ndarray) -> None:
    """Moves, then swaps, of a client on the busiest rank that shorten it without making any
    other rank as busy; stops when none helps (or after a bounded number of passes)."""
    loads = np.array([w[jobs].sum() if jobs else 0.0 for jobs in out])
    for _ in range(_MAX_PASSES):
        finish = loads / s
        top = int(np.argmax(finish))
        best = finish[top]
        done = False
        for j in sorted(out[top], key=lambda j: -w[j]):
            for r in range(s.size):
                if r != top and max((loads[top] - w[j]) / s[top],
                                    (loads[r] + w[j]) / s[r]) < best - 1e-12:
                    out[top].remove(j)
                    out[r].append(j)
                    loads[top] -= w[j]
                    loads[r] += w[j]
                    done = True
                    break
            if done:
                break
        if done:
            continue
        for j in out[top]:
            for r in range(s.size):
                if r == top:
                    continue
                for k in out[r]:
                    if w[k] >= w[j]:
                        continue
                    gain = w[j] - w[k]
                    if max((loads[top] - gain) / s[top], (loads[r] + gain) / s[r]) < best - 1e-12:
                        out[top][out[top].index(j)] = k
                        out[r][out[r].index(k)] = j
                        loads[top] -= gain
                        loads[r] += gain
                        done = True
                        break
                if done:
                    break
            if done:
                break
        if not done:
            return


def schedule_clients(work: Sequence[float], speeds: Sequence[float],
                     method: str = "lpt") -> list[list[int]]:
    """For each rank, the positions (into ``work``) of the clients it trains, in the order it
    should train them. ``work``: each client's predicted cost on a speed-1 rank; ``speeds``:
    each rank's relative speed. The result depends only on its inputs (same on every rank)."""
    w, s = _check(work, speeds)
    if method == "static":
        return [list(map(int, p)) for p in np.array_split(np.arange(w.size), s.size)]
    if method != "lpt":
        raise ValueError(f"unknown scheduler {method!r}; known: {', '.join(SCHEDULERS)}")
    out = _lpt(w, s)
    _improve(out, w, s)
    return out
