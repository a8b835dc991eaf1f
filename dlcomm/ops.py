"""Reduction operations, named as in Horovod (``hvd.Average``, ``hvd.Sum``, ...)."""
from __future__ import annotations

import enum


class ReduceOp(enum.Enum):
    """How an all-reduce combines the ranks' tensors."""

    AVERAGE = "average"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"
    ADASUM = "adasum"  # reserved for Horovod compatibility; rejected with a clear error

    def __repr__(self) -> str:  # short form used in error messages
        return self.name.capitalize()


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT
Adasum = ReduceOp.ADASUM


class UnsupportedOpError(ValueError, NotImplementedError):
    """A reduce op dlcomm does not have (Adasum): a ValueError about the argument, and the
    NotImplementedError (a RuntimeError) Horovod raises where it lacks the op (a
    reduce-scatter, an IndexedSlices all-reduce)."""


def as_reduce_op(op: object) -> ReduceOp:
    """Accept a ``ReduceOp`` or its name ("sum", "Average"); raise ``ValueError`` otherwise."""
    if isinstance(op, ReduceOp):
        result = op
    elif isinstance(op, str) and op.lower() in {o.value for o in ReduceOp}:
        result = ReduceOp(op.lower())
    else:
        valid = ", ".join(o.name.capitalize() for o in ReduceOp if o is not ReduceOp.ADASUM)
        raise ValueError(f"unknown reduce op {op!r}; valid ops: {valid}")
    if result is ReduceOp.ADASUM:
        raise UnsupportedOpError("op=Adasum is not supported by dlcomm; use Average or Sum")
    return result
