"""Where each inverse and each preconditioned gradient lies in the buffers ranks exchange.

After an inverse update every rank of a column all-gathers what its members computed (one
collective per column instead of one broadcast per factor), and in MEM-OPT and HYBRID-OPT
every rank of a row all-gathers the preconditioned gradients its members computed. Each
member contributes a 1-D buffer: its items, in layer order, A before G. Every rank derives the
same layout from the placement, so the buffers carry no headers.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from dlcomm.kfac.factors import upper_size
from dlcomm.kfac.placement import Placement

FACTORS = ("A", "G")
COMPUTE_METHODS = ("eigen", "inverse")


@dataclass(frozen=True)
class Segment:
    """One item of an exchanged buffer: ``factor`` is "A", "G" or "grad"."""

    layer: str
    factor: str
    offset: int
    size: int
    rank: int  # the member that contributes it


def inverse_payload_size(dim: int, compute_method: str, symmetric: bool) -> int:
    """Elements one factor's inversion result occupies: the eigenvectors and eigenvalues, or
    the inverse (its upper triangle when ``symmetric``)."""
    if compute_method == "eigen":
        return dim * dim + dim
    if compute_method == "inverse":
        return upper_size(dim) if symmetric else dim * dim
    raise ValueError(f"compute_method must be one of {COMPUTE_METHODS}, got {compute_method!r}")


class ExchangePlan:
    """Layouts of the inverse (per column) and gradient (per row) all-gathers."""

    def __init__(self, placement: Placement, dims: Mapping[str, tuple[int, int]],
                 compute_method: str, symmetric: bool) -> None:
        missing = [name for name in placement.layers if name not in dims]
        if missing:
            raise ValueError(f"no factor dimensions for layers {missing}")
        inverse_payload_size(1, compute_method, symmetric)  # validates compute_method
        self.placement = placement
        self.grid = placement.grid
        self.dims = {name: dims[name] for name in placement.layers}
        self.compute_method = compute_method
        self.symmetric = symmetric

    def factor_dim(self, layer: str, factor: str) -> int:
        a_dim, g_dim = self.dims[layer]
        return a_dim if factor == "A" else g_dim

    def owned(self, rank: int, ready: Collection[str] | None = None) -> list[tuple[str, str]]:
        """(layer, factor) this rank inverts, in layer order, A before G."""
        return [(layer, factor) for layer in self._layers(ready) for factor in FACTORS
                if self.placement.owner(layer, factor) == rank]

    def column_layers(self, column: int, ready: Collection[str] | None = None) -> list[str]:
        """Layers whose gradient workers are ``column``'s ranks."""
        return [layer for layer in self._layers(ready) if self.placement.column(layer) == column]

    def inverse_segments(self, column: int,
                         ready: Collection[str] | None = None) -> list[Segment]:
        """The column's all-gathered inverses: each member's items, members in rank order."""
        out: list[Segment] = []
        offset = 0
        for rank in self.grid.column_ranks(column):
            for layer, factor in self.owned(rank, ready):
                size = inverse_payload_size(self.factor_dim(layer, factor),
                                            self.compute_method, self.symmetric)
                out.append(Segment(layer, factor, offset, size, rank))
                offset += size
        return out

    def grad_segments(self, row: int, ready: Collection[str] | None = None) -> list[Segment]:
        """The row's all-gathered preconditioned gradients: each member's column's layers."""
        out: list[Segment] = []
        offset = 0
        for rank in self.grid.row_ranks(row):
            for layer in self.column_layers(self.grid.column_of(rank), ready):
                a_dim, g_dim = self.dims[layer]
                out.append(Segment(layer, "grad", offset, a_dim * g_dim, rank))
                offset += a_dim * g_dim
        return out

    def _layers(self, ready: Collection[str] | None) -> list[str]:
        layers = self.placement.layers
        return list(layers) if ready is None else [la for la in layers if la in ready]
