"""Server strategies of ``dlcomm.fl``: FedAvg, FedProx, FedOpt (server Adam/Yogi/Adagrad),
FedNova and SCAFFOLD, found by name with ``get_strategy``."""
from dlcomm.fl.strategies.base import Strategy
from dlcomm.fl.strategies.fedavg import FedAvg
from dlcomm.fl.strategies.fednova import FedNova
from dlcomm.fl.strategies.fedopt import FedOpt
from dlcomm.fl.strategies.fedprox import FedProx
from dlcomm.fl.strategies.registry import available_strategies, get_strategy
from dlcomm.fl.strategies.scaffold import Scaffold

__all__ = ["FedAvg", "FedNova", "FedOpt", "FedProx", "Scaffold", "Strategy",
           "available_strategies", "get_strategy"]
