"""Gradient compression: compressors, error feedback, a registry, and per-tensor exchange.

Quick use::

    from dlcomm.compression import get_compressor, compressed_allreduce, MPICommAdapter
    c = get_compressor("topk:ratio=0.01")          # error feedback included by default
    avg = compressed_allreduce(c, grad, "layer1.weight", MPICommAdapter(MPI.COMM_WORLD))

See docs/compression.md for the interface, each compressor and the measured throughput.
"""
from dlcomm.array_api import array_namespace
from dlcomm.compression.base import (
    ALLGATHER,
    ALLREDUCE,
    HOST,
    PEER,
    SPARSE_MERGE,
    WORLD,
    Compressor,
    CompressorWrapper,
    Context,
)
from dlcomm.compression.casts import BF16Compressor, FP16Compressor, NoneCompressor
from dlcomm.compression.error_feedback import ErrorFeedback
from dlcomm.compression.exchange import (
    ExchangeComm,
    MPICommAdapter,
    SelfComm,
    compressed_allreduce,
    sparse_tree_merge,
)
from dlcomm.compression.gtopk import GTopK
from dlcomm.compression.htopk import HierarchicalTopK
from dlcomm.compression.lowrank import ACPSGD, PowerSGD
from dlcomm.compression.payload_cast import PayloadCast
from dlcomm.compression.qsgd import QSGD
from dlcomm.compression.registry import (
    available_compressors,
    compressor_from_env,
    get_compressor,
    parse_spec,
    register_compressor,
)
from dlcomm.compression.sign import EFSignSGD, Signum
from dlcomm.compression.sparsify import RandomK, TopK

__all__ = [
    "ACPSGD", "ALLGATHER", "ALLREDUCE", "BF16Compressor", "Compressor", "CompressorWrapper",
    "Context", "EFSignSGD", "ErrorFeedback", "ExchangeComm", "FP16Compressor", "GTopK", "HOST",
    "HierarchicalTopK", "MPICommAdapter", "NoneCompressor", "PEER", "PayloadCast", "PowerSGD",
    "QSGD", "RandomK", "SPARSE_MERGE", "SelfComm", "Signum", "TopK", "WORLD", "array_namespace",
    "available_compressors", "compressed_allreduce", "compressor_from_env", "get_compressor",
    "parse_spec", "register_compressor", "sparse_tree_merge",
]
