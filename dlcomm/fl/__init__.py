"""Federated learning at simulation scale (FedML Parrot's design) on dlcomm's public API.

A user writes one client update, ``fn(client_id, weights, ctx) -> ClientResult``, and picks a
strategy. ``Simulation`` runs a thousand clients on a few ranks: each rank trains its share of
a round's clients one after another, sums their contributions, and one all-reduce per round
finishes the aggregate; clients go to ranks by predicted cost so no rank straggles, and client
state lives in host memory up to a budget, then on disk. ``Deployment`` runs the same function
and strategy with one rank per client; ``run_reference`` is the single-process reference.
Framework-free (numpy arrays keyed by name); ``dlcomm.torch.fl`` wraps a torch module.
"""
from dlcomm.fl.arrays import NamedArrays
from dlcomm.fl.client import ClientContext, ClientResult, GradientCorrection
from dlcomm.fl.cost_model import CostModel
from dlcomm.fl.deployment import Deployment
from dlcomm.fl.partition import dirichlet_partition, iid_partition
from dlcomm.fl.reference import run_reference
from dlcomm.fl.report import RoundReport
from dlcomm.fl.sampling import client_seed, sample_clients
from dlcomm.fl.scheduler import SCHEDULERS, ideal_makespan, makespan, schedule_clients
from dlcomm.fl.simulation import Simulation
from dlcomm.fl.state_store import ClientStateStore
from dlcomm.fl.strategies import (
    FedAvg,
    FedNova,
    FedOpt,
    FedProx,
    Scaffold,
    Strategy,
    available_strategies,
    get_strategy,
)
from dlcomm.fl.trace import ClientTrace, rank_speeds

__all__ = [
    "SCHEDULERS", "ClientContext", "ClientResult", "ClientStateStore", "ClientTrace",
    "CostModel", "Deployment", "FedAvg", "FedNova", "FedOpt", "FedProx", "GradientCorrection",
    "NamedArrays", "RoundReport", "Scaffold", "Simulation", "Strategy", "available_strategies",
    "client_seed", "dirichlet_partition", "get_strategy", "iid_partition", "ideal_makespan",
    "makespan", "rank_speeds", "run_reference", "sample_clients", "schedule_clients",
]
