"""LB-BSP (load-balanced bulk synchronous parallel): right-size each rank's batch at every
iteration boundary so that stragglers get less work and all ranks reach the barrier together.

The global batch ``B`` stays fixed. After each iteration the ranks share their measured
speed (samples per second of compute, one small all-gather), predict the next one, and
``allocate_batches`` turns the predictions into integer local batches ``b_i`` that sum to
``B`` and stay within ``[min_batch, max_batch]`` (memory bounds). Gradients weighted by
``b_i / B`` and summed give the full-batch gradient. Predictors: an exponential moving
average, and a NARX-style learned one (scikit-learn regressor on lagged speeds and the
batch size as exogenous input), as in Chen et al., "Accelerating Distributed Learning in
Non-Dedicated Environments" (TCC 2021).
"""
from __future__ import annotations

import numbers
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from dlcomm import mpi_ops
from dlcomm.heterogeneity.agreement import check_same_settings
from dlcomm.heterogeneity.world_comm import base_comm


def _check_int(value: object, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    return int(value)


def allocate_batches(speeds: Sequence[float], total: int, min_batch: int = 1,
                     max_batch: int | None = None) -> list[int]:
    """Integer batch sizes proportional to ``speeds``, summing to ``total``, within bounds.

    Proportional shares are clipped to ``[min_batch, max_batch]`` and the rest is
    re-shared among the unclipped ranks (water filling: ``clip(lam * speed)`` for the ``lam``
    at which they sum to ``total``); the fractional parts are rounded by largest remainder
    (ties to the lower rank), so the result is deterministic.
    """
    s = np.asarray(speeds, dtype=np.float64)
    if s.ndim != 1 or s.size == 0:
        raise ValueError("speeds must be a non-empty 1-D sequence")
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise ValueError(f"speeds must be finite and > 0, got {s.tolist()}")
    n = s.size
    total = _check_int(total, "total", 1)
    lo = _check_int(min_batch, "min_batch", 0)
    hi = total if max_batch is None else _check_int(max_batch, "max_batch", 1)
    if lo > hi:
        raise ValueError(f"min_batch ({lo}) is larger than max_batch ({hi})")
    if not n * lo <= total <= n * hi:
        raise ValueError(f"a global batch of {total} cannot be split over {n} ranks within "
                         f"[{lo}, {hi}] each: need {n * lo} <= total <= {n * hi}")
    # Water filling: the shares are clip(lam * s, lo, hi) for the lam at which they sum to
    # total (the sum is continuous and non-decreasing in lam, so bisection finds it).
    # Fixing the clipped ranks round by round can over-commit when some ranks hit the
    # floor and others the ceiling in the same round.
    low, high = 0.0, hi / s.min()
    for _ in range(200):
        lam = (low + high) / 2
        if np.clip(lam * s, lo, hi).sum() < total:
            low = lam
        else:
            high = lam
    share = np.clip(high * s, lo, hi)
    sizes = np.floor(share).astype(np.int64)
    rest = total - int(sizes.sum())
    frac = share - sizes
    for i in sorted(range(n), key=lambda i: (-frac[i], i)):  # largest remainder
        if rest <= 0:
            break
        if sizes[i] < hi:
            sizes[i] += 1
            rest -= 1
    for i in range(n):  # rounding can leave a deficit only when every top share was full
        while rest > 0 and sizes[i] < hi:
            sizes[i] += 1
            rest -= 1
    return [int(b) for b in sizes]


class MovingAveragePredictor:
    """Predicts each rank's next speed as an exponential moving average of its history."""

    def __init__(self, alpha: float = 0.5) -> None:
        if not isinstance(alpha, numbers.Real) or not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        self.alpha = float(alpha)
        self._ema: np.ndarray | None = None

    def observe(self, speeds: np.ndarray, batches: np.ndarray) -> None:
        """Record one iteration's measured speeds (and the batch sizes that produced them)."""
        x = np.asarray(speeds, dtype=np.float64)
        self._ema = x.copy() if self._ema is None else (
            self.alpha * x + (1 - self.alpha) * self._ema)

    def predict(self) -> np.ndarray | None:
        """Predicted speeds of the next iteration, or None before any observation."""
        return None if self._ema is None else self._ema.copy()

    def state_dict(self) -> dict:
        """The moving average so far (plain Python values, for checkpoints)."""
        return {"kind": "ema", "alpha": self.alpha,
                "ema": None if self._ema is None else [float(v) for v in self._ema]}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned."""
        _check_predictor_state(state, "ema")
        ema = state.get("ema")
        self._ema = None if ema is None else _float_array(ema, "ema")


class NARXPredictor:
    """NARX-style predictor: a scikit-learn regressor maps a rank's last ``lags`` speeds and
    its next batch size (exogenous input) to its next speed; one model shared by all ranks,
    refitted every ``refit_every`` observations on the recent ``history`` iterations.

    ``model``: ``"mlp"`` (``MLPRegressor``, the paper's neural network) or ``"ridge"``.
    Until enough history exists it falls back to a moving average.
    """

    def __init__(self, lags: int = 3, model: str = "mlp", refit_every: int = 10,
                 history: int = 200, seed: int = 0) -> None:
        self.lags = _check_int(lags, "lags", 1)
        if model not in ("mlp", "ridge"):
            raise ValueError(f"model must be 'mlp' or 'ridge', got {model!r}")
        self.model_name = model
        self.refit_every = _check_int(refit_every, "refit_every", 1)
        self.history = _check_int(history, "history", self.lags + 2)
        self.seed = _check_int(seed, "seed", 0)
        self._speeds: list[np.ndarray] = []
        self._batches: list[np.ndarray] = []
        self._model = None
        self._scale = 1.0
        self._fallback = MovingAveragePredictor()
        self._since_fit = 0
        self._fitted_on: tuple[list[np.ndarray], list[np.ndarray]] | None = None

    def _new_model(self):  # noqa: ANN202 - a scikit-learn estimator
        # scikit-learn is an optional dependency, needed by the NARX predictor only.
        if self.model_name == "ridge":
            from sklearn.linear_model import Ridge  # noqa: PLC0415

            return Ridge(alpha=1e-3)
        from sklearn.neural_network import MLPRegressor  # noqa: PLC0415

        return MLPRegressor(hidden_layer_sizes=(16,), max_iter=300, random_state=self.seed)

    def _features(self, t: int, next_batch: np.ndarray) -> np.ndarray:
        lagged = np.stack(self._speeds[t - self.lags:t], axis=1) / self._scale
        return np.concatenate([lagged, next_batch[:, None] / 1000.0], axis=1)

    def observe(self, speeds: np.ndarray, batches: np.ndarray) -> None:
        """Record one iteration's measured speeds and the batch sizes that produced them."""
        x = np.asarray(speeds, dtype=np.float64)
        self._speeds.append(x)
        self._batches.append(np.asarray(batches, dtype=np.float64))
        del self._speeds[:-self.history], self._batches[:-self.history]
        self._fallback.observe(x, batches)
        self._since_fit += 1
        if len(self._speeds) > self.lags + 1 and (self._model is None
                                                  or self._since_fit >= self.refit_every):
            self._fit()

    def _fit(self) -> None:
        # What the model was fitted on, so that a checkpoint can refit the same model.
        self._fitted_on = ([a.copy() for a in self._speeds], [b.copy() for b in self._batches])
        self._scale = float(np.mean(self._speeds)) or 1.0
        rows, targets = [], []
        for t in range(self.lags, len(self._speeds)):
            rows.append(self._features(t, self._batches[t]))
            targets.append(self._speeds[t] / self._scale)
        model = self._new_model()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # few samples: convergence warnings are expected
            model.fit(np.concatenate(rows), np.concatenate(targets))
        self._model = model
        self._since_fit = 0

    def predict(self, next_batches: np.ndarray | None = None) -> np.ndarray | None:
        """Predicted speeds of the next iteration (``next_batches``: default the last)."""
        if self._model is None:
            return self._fallback.predict()
        nb = self._batches[-1] if next_batches is None else np.asarray(next_batches, float)
        pred = self._model.predict(self._features(len(self._speeds), nb)) * self._scale
        floor = 0.05 * np.min(self._speeds[-1])  # a regressor may overshoot below zero
        return np.maximum(pred, floor)

    def state_dict(self) -> dict:
        """The speed and batch history, the data of the last fit (the model is refitted on
        it when loading: the regressor is deterministic for its seed) and the fallback's
        state, as plain Python values."""
        def rows(arrays: list[np.ndarray]) -> list[list[float]]:
            return [[float(v) for v in a] for a in arrays]

        return {"kind": "narx", "model": self.model_name, "lags": self.lags,
                "seed": self.seed, "speeds": rows(self._speeds), "batches": rows(self._batches),
                "since_fit": self._since_fit,
                "fitted_on": None if self._fitted_on is None else [
                    rows(self._fitted_on[0]), rows(self._fitted_on[1])],
                "fallback": self._fallback.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned (refits the model on the saved data)."""
        _check_predictor_state(state, "narx")
        for key, mine in (("model", self.model_name), ("lags", self.lags), ("seed", self.seed)):
            if state.get(key) != mine:
                raise ValueError(f"the checkpoint's NARX predictor has {key}="
                                 f"{state.get(key)!r}, this one {mine!r}")

        def arrays(rows: Any, what: str) -> list[np.ndarray]:
            return [_float_array(r, what) for r in rows]

        speeds, batches = arrays(state["speeds"], "speeds"), arrays(state["batches"], "batches")
        if len(speeds) != len(batches):
            raise ValueError("NARX state: speeds and batches differ in length")
        fitted = state.get("fitted_on")
        self._fallback.load_state_dict(state["fallback"])
        self._model, self._scale, self._fitted_on = None, 1.0, None
        if fitted is not None:
            self._speeds, self._batches = (arrays(fitted[0], "speeds"),
                                           arrays(fitted[1], "batches"))
            self._fit()
        self._speeds, self._batches = speeds, batches
        self._since_fit = int(state["since_fit"])


def _check_predictor_state(state: object, kind: str) -> None:
    if not isinstance(state, dict) or state.get("kind") != kind:
        found = state.get("kind") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"the checkpoint holds the state of a {found!r} speed predictor; "
                         f"this balancer predicts with {kind!r}")


def _float_array(values: object, what: str) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 1 or not np.all(np.isfinite(a)):
        raise ValueError(f"predictor state: {what} must be a list of finite numbers")
    return a


def make_predictor(name: str) -> MovingAveragePredictor | NARXPredictor:
    """``"ema"`` (moving average), ``"narx"`` (MLP) or ``"narx-ridge"``."""
    if name == "ema":
        return MovingAveragePredictor()
    if name == "narx":
        return NARXPredictor(model="mlp")
    if name == "narx-ridge":
        return NARXPredictor(model="ridge")
    raise ValueError(f"unknown predictor {name!r}: use ema, narx or narx-ridge")


class BatchBalancer:
    """Keeps the local batch sizes of all ranks; ``update`` re-sizes them every ``interval``
    iterations from each rank's speed over the interval (samples / compute seconds, summed
    over the interval: one noisy iteration on a shared machine must not move the batches).
    The first intervals ramp up (2, 4, 8, ... iterations, up to ``interval``), so a job is
    balanced within its first few steps instead of running ``interval`` steps at the
    straggler's pace; the moving-average predictor then smooths the early, noisier speeds.

    ``batch_sizes`` is the same list on every rank (each computes it from the same gathered
    speeds). ``weight`` is this rank's ``b_i / B``: the prescale of a Sum all-reduce that
    makes the summed gradient the full-batch gradient.
    """

    def __init__(self, global_batch: int, num_ranks: int, rank: int, min_batch: int = 1,
                 max_batch: int | None = None, predictor: str | object = "ema",
                 interval: int = 8) -> None:
        self.global_batch = _check_int(global_batch, "global_batch", 1)
        self.num_ranks = _check_int(num_ranks, "num_ranks", 1)
        self.rank = _check_int(rank, "rank", 0)
        if self.rank >= self.num_ranks:
            raise ValueError(f"rank {rank} is outside [0, {num_ranks})")
        self.min_batch = _check_int(min_batch, "min_batch", 0)
        self.max_batch = global_batch if max_batch is None else _check_int(
            max_batch, "max_batch", 1)
        self.interval = _check_int(interval, "interval", 1)
        self.predictor = make_predictor(predictor) if isinstance(predictor, str) else predictor
        self.predictor_name = predictor if isinstance(predictor, str) else type(predictor).__name__
        if not hasattr(self.predictor, "observe") or not hasattr(self.predictor, "predict"):
            raise TypeError("predictor must be 'ema', 'narx', 'narx-ridge' or an object with "
                            "observe(speeds, batches) and predict()")
        self.batch_sizes = allocate_batches([1.0] * self.num_ranks, self.global_batch,
                                            self.min_batch, self.max_batch)
        self.iterations = 0
        self._span = min(2, self.interval)  # length of the current interval (ramps up)
        self._since = 0  # iterations recorded in the current interval
        self._samples = 0.0  # this rank's samples and compute seconds in the current interval
        self._seconds = 0.0

    def check_same_on_all_ranks(self, comm: Any = None) -> None:
        """Raise ``MismatchError`` on every rank unless all ranks built their balancer with
        the same settings (different global batches or bounds would hand out overlapping
        samples and wrong weights; different intervals would meet in the speed all-gather at
        different iterations). Collective over ``comm`` (default: dlcomm's ranks)."""
        check_same_settings(base_comm(comm), "LB-BSP's BatchBalancer", {
            "global_batch": self.global_batch, "num_ranks": self.num_ranks,
            "min_batch": self.min_batch, "max_batch": self.max_batch,
            "interval": self.interval, "predictor": self.predictor_name})

    _SETTINGS = ("global_batch", "num_ranks", "min_batch", "max_batch", "interval",
                 "predictor_name")

    def state_dict(self) -> dict:
        """Everything the next re-sizing depends on, as plain Python values (for
        checkpoints): the settings (checked when loading), the batch sizes, the position in
        the current interval with this rank's samples and seconds so far, and the speed
        predictor's history. ``samples``/``seconds`` are this rank's: each rank saves its own."""
        predictor = (self.predictor.state_dict() if hasattr(self.predictor, "state_dict")
                     else None)
        return {**{k: getattr(self, k) for k in self._SETTINGS},
                "batch_sizes": list(self.batch_sizes), "iterations": self.iterations,
                "span": self._span, "since": self._since, "samples": float(self._samples),
                "seconds": float(self._seconds), "predictor": predictor}

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` returned. Settings that differ from this balancer's
        (another global batch, number of ranks, bounds, interval or predictor) raise
        ``ValueError``: the saved sizes and history would not fit them."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from BatchBalancer.state_dict(), got "
                            f"{type(state).__name__}")
        missing = [k for k in (*self._SETTINGS, "batch_sizes", "iterations", "span", "since",
                               "samples", "seconds") if k not in state]
        if missing:
            raise ValueError(f"BatchBalancer state lacks {missing}")
        differ = {k: (state[k], getattr(self, k)) for k in self._SETTINGS
                  if state[k] != getattr(self, k)}
        if differ:
            text = ", ".join(f"{k} {a!r} there, {b!r} here" for k, (a, b) in differ.items())
            raise ValueError(f"the checkpoint's LB-BSP balancer was built with other settings "
                             f"({text}); resume with the same settings")
        sizes = [_check_int(b, "batch_sizes[i]", self.min_batch) for b in state["batch_sizes"]]
        if (len(sizes) != self.num_ranks or sum(sizes) != self.global_batch
                or max(sizes) > self.max_batch):
            raise ValueError(f"BatchBalancer state: batch_sizes {sizes} do not split "
                             f"{self.global_batch} over {self.num_ranks} ranks within "
                             f"[{self.min_batch}, {self.max_batch}]")
        predictor = state.get("predictor")
        if predictor is not None:
            if not hasattr(self.predictor, "load_state_dict"):
                raise ValueError(f"the checkpoint holds predictor state, but this balancer's "
                                 f"predictor ({self.predictor_name}) cannot load it")
            self.predictor.load_state_dict(predictor)
        elif hasattr(self.predictor, "state_dict"):
            raise ValueError("the checkpoint holds no predictor state for this balancer's "
                             f"predictor ({self.predictor_name})")
        self.batch_sizes = sizes
        self.iterations = _check_int(state["iterations"], "iterations", 0)
        self._span = _check_int(state["span"], "span", 1)
        self._since = _check_int(state["since"], "since", 0)
        self._samples = float(state["samples"])
        self._seconds = float(state["seconds"])

    @property
    def local_batch(self) -> int:
        """This rank's batch size for the coming iteration."""
        return self.batch_sizes[self.rank]

    @property
    def weight(self) -> float:
        """``b_i / B`` for this rank."""
        return self.local_batch / self.global_batch

    def offsets(self) -> list[int]:
        """Start of each rank's slice inside one global batch (prefix sums of the sizes)."""
        return [0, *np.cumsum(self.batch_sizes)[:-1].astype(int).tolist()]

    def update_from_speeds(self, speeds: Sequence[float]) -> list[int]:
        """Record every rank's measured speed (one interval) and re-size the batches."""
        s = np.asarray(speeds, dtype=np.float64).reshape(-1)
        if s.size != self.num_ranks:
            raise ValueError(f"expected {self.num_ranks} speeds, got {s.size}")
        if not np.all(np.isfinite(s)) or np.any(s <= 0):
            raise ValueError(f"speeds must be finite and > 0, got {s.tolist()}")
        self.predictor.observe(s, np.asarray(self.batch_sizes, dtype=np.float64))
        pred = self.predictor.predict()
        if pred is not None:
            self.batch_sizes = allocate_batches(pred, self.global_batch, self.min_batch,
                                                self.max_batch)
        return list(self.batch_sizes)

    def update(self, samples: int, seconds: float) -> list[int]:
        """Record one iteration of this rank (``samples`` computed in ``seconds``); at the
        end of each interval (2, 4, ... then every ``interval`` iterations) share the
        interval's speed with all ranks (all-gather) and ``update_from_speeds``. Collective:
        every rank calls it after every iteration."""
        if seconds <= 0 or samples < 0:
            raise ValueError(f"need samples >= 0 and seconds > 0, got {samples}, {seconds}")
        self._samples += max(samples, 1)
        self._seconds += seconds
        self.iterations += 1
        self._since += 1
        if self._since < self._span:
            return list(self.batch_sizes)
        self._since = 0
        self._span = min(2 * self._span, self.interval)
        mine = np.array([self._samples / self._seconds], dtype=np.float64)
        self._samples = self._seconds = 0.0
        speeds = mpi_ops.allgather(mine, name="lbbsp.speeds")
        return self.update_from_speeds(speeds)
