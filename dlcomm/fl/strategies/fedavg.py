"""FedAvg (McMahan et al. 2017): the sample-weighted average of the clients' models."""
from __future__ import annotations

from dlcomm.fl.strategies.base import Strategy


class FedAvg(Strategy):
    """w <- w + server_lr * sum_i n_i (w_i - w) / sum_i n_i; server_lr = 1 is plain FedAvg."""

    name = "fedavg"
