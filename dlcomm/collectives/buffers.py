"""Argument checks shared by the point-to-point collectives, and the communicator they take.

The algorithms run on the transport's communicator (``dlcomm.comm``); an mpi4py
intracommunicator is accepted too and wrapped. Data travels as raw bytes (the transport
sends a ``uint8`` view of each numpy block): the sender and receiver already agree on dtype
and count, so float16 needs no MPI datatype. Reductions happen in numpy on the typed arrays.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from dlcomm.comm.mpi_backend import TransportError, as_communicator
from dlcomm.comm.protocol import PointToPoint
from dlcomm.errors import DLCommError

# What the public algorithms take: a transport communicator or an mpi4py intracommunicator.
CommLike = Any

# Kinds a reduction can combine: signed/unsigned integers, floats, complex.
_NUMERIC_KINDS = "iufc"

F = TypeVar("F", bound=Callable)


def check_comm(comm: CommLike) -> PointToPoint:
    """The transport communicator of ``comm``: a ``dlcomm.comm`` communicator as it is, an
    mpi4py intracommunicator (COMM_WORLD, a Split or Dup of it) wrapped; TypeError or
    ValueError (COMM_NULL) otherwise."""
    return as_communicator(comm)


def check_flat_array(name: str, array: object, *, writeable: bool = False) -> np.ndarray:
    """Require a contiguous 1-D numeric numpy array (callers flatten tensors first)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(array).__name__}")
    if array.ndim != 1:
        raise ValueError(
            f"{name} must be 1-D, got shape {array.shape}; flatten it with .reshape(-1)"
        )
    if not array.flags.c_contiguous:
        raise ValueError(f"{name} must be contiguous; pass np.ascontiguousarray({name})")
    if array.dtype.kind not in _NUMERIC_KINDS:
        raise TypeError(f"{name} has dtype {array.dtype}; only numeric dtypes can be reduced")
    if writeable and not array.flags.writeable:
        raise ValueError(f"{name} is read-only; the result is written into it")
    return array


def check_send_recv_pair(
    sendbuf: object, recvbuf: object, *, same_size: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Check both buffers and that they agree; ``sendbuf is recvbuf`` means in place.

    Buffers that overlap without being the same array are refused: the algorithms read
    the input after writing parts of the output.
    """
    send = check_flat_array("sendbuf", sendbuf)
    recv = check_flat_array("recvbuf", recvbuf, writeable=True)
    if send.dtype != recv.dtype:
        raise TypeError(f"sendbuf dtype {send.dtype} differs from recvbuf dtype {recv.dtype}")
    if same_size and send.size != recv.size:
        raise ValueError(
            f"sendbuf has {send.size} elements but recvbuf has {recv.size}; they must match"
        )
    if not is_same_buffer(send, recv) and np.shares_memory(send, recv):
        raise ValueError(
            "sendbuf and recvbuf overlap; pass the same array twice for in-place use"
        )
    return send, recv


def is_same_buffer(a: np.ndarray, b: np.ndarray) -> bool:
    """True when ``a`` and ``b`` are views of exactly the same memory (in-place call)."""
    if a is b:
        return True
    return (
        a.size == b.size
        and a.dtype == b.dtype
        and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    )


def raise_collective_errors(func: F) -> F:
    """Turn a transport failure inside a collective into a ``DLCommError`` naming it.

    The most common cause is ranks passing different sizes or counts (MPI_ERR_TRUNCATE).
    """

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except TransportError as exc:
            raise DLCommError(
                f"{func.__name__} failed in MPI: {exc}; check that every rank passes the "
                "same size, dtype, counts and root"
            ) from exc

    return wrapper  # type: ignore[return-value]
