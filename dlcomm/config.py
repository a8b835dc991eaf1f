"""Every knob of dlcomm, with its environment variable, Python argument, default and meaning.

One table: ``KNOBS``. ``load_config(**overrides)`` reads ``DLCOMM_<NAME>`` from the
environment and lets a keyword argument of the same name (lower case) win.
``docs/knobs.md`` is generated from this table (``python -m dlcomm.config``).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

_SIZE_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_bytes(text: str) -> int:
    """Parse a byte count: ``67108864``, ``64M``, ``64MiB``, ``512k``."""
    t = str(text).strip().lower().removesuffix("ib").removesuffix("b")
    mult = 1
    if t and t[-1] in _SIZE_SUFFIXES:
        mult = _SIZE_SUFFIXES[t[-1]]
        t = t[:-1]
    value = float(t) * mult
    if value < 0 or value != int(value):
        raise ValueError(f"not a whole, non-negative number of bytes: {text!r}")
    return int(value)


def parse_choice(value: object, valid: tuple[str, ...], *, what: str,
                 source: str | None = None) -> str:
    """``value`` lower-cased and stripped if it is one of ``valid``; else ``TypeError`` (not a
    str) or ``ValueError`` naming ``what``, where it came from (``source``, when given) and
    the choices."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str (one of {', '.join(valid)}) or None, got "
                        f"{type(value).__name__}")
    name = value.strip().lower()
    if name not in valid:
        where = f" ({source})" if source else ""
        raise ValueError(f"unknown {what} {value!r}{where}; valid: {', '.join(valid)}")
    return name


def parse_bool(text: str) -> bool:
    """Parse 1/0, true/false, yes/no, on/off."""
    t = str(text).strip().lower()
    if t in {"1", "true", "yes", "on"}:
        return True
    if t in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"not a boolean: {text!r} (use 1 or 0)")


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError(f"must be >= 0, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"must be > 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"must be >= 1, got {text!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Knob:
    """One setting: ``DLCOMM_<NAME>`` in the environment, ``<name>=`` as an argument."""

    name: str
    default: Any
    parse: Callable[[str], Any]
    doc: str
    where: str = "init"  # which call takes the argument

    @property
    def env(self) -> str:
        return "DLCOMM_" + self.name.upper()


NEGOTIATIONS = ("auto", "mpi", "tcp")  # DLCOMM_NEGOTIATION

KNOBS: tuple[Knob, ...] = (
    Knob("cycle_time", 1.0, _non_negative_float,
         "Milliseconds the engine waits to batch requests before each negotiation round. "
         "Idle ranks back off to a round every 5 ms, and every 50 ms once a round finds the "
         "whole job idle (a request wakes its own rank at once)."),
    Knob("fusion_threshold", 64 << 20, parse_bytes,
         "Largest fusion buffer in bytes (suffixes k, M, G allowed). All-reduces that share "
         "process set, dtype, op and compression are packed up to this size and sent as one "
         "message. 0 disables fusion."),
    Knob("cache_capacity", 1024, lambda t: int(t),
         "Entries in the response cache; a repeated set of tensors then skips the "
         "negotiation round's full exchange. 0 disables the cache."),
    Knob("stall_warning_seconds", 60.0, _non_negative_float,
         "Seconds a tensor may wait for other ranks before a warning names the missing "
         "ranks. 0 disables the stall check."),
    Knob("stall_shutdown_seconds", 0.0, _non_negative_float,
         "Seconds after which a stall aborts the job with the same message on every rank. "
         "0 (default) only warns."),
    Knob("timeline", "", str,
         "Path of a Chrome-trace JSON timeline ('{rank}' is replaced by the rank; without "
         "it only rank 0 writes). Empty: off."),
    Knob("timeline_mark_cycles", False, parse_bool,
         "Mark every negotiation round that has work (CYCLE_START) in the timeline, as "
         "Horovod's HOROVOD_TIMELINE_MARK_CYCLES."),
    Knob("backend", "auto", str,
         "Data-path backend: 'auto' (NCCL for CuPy arrays when available, MPI otherwise), "
         "'mpi' or 'nccl'."),
    Knob("log_level", "warning", str,
         "Logging level of the 'dlcomm' logger (to stderr unless the application "
         "configured logging)."),
    Knob("compression", "none", str,
         "Compressor used by DistributedOptimizer when no compression= is given, e.g. "
         "'topk:ratio=0.01' (see docs/compression.md).", where="DistributedOptimizer"),
    Knob("min_compress_size", 1024, lambda t: int(t),
         "Tensors with fewer elements bypass compression (sent dense).",
         where="get_compressor"),
    Knob("compress_1d", False, parse_bool,
         "Compress 1-D tensors (biases, norms) too; by default they go dense.",
         where="get_compressor"),
    Knob("native", True, parse_bool,
         "Use the C++ kernels of native/ (float16/bfloat16 casts and sums, sign packing, "
         "fused error-feedback selection); 0 falls back to numpy.", where="import"),
    Knob("native_threads", 0, lambda t: int(t),
         "OpenMP threads of the native kernels (0: cores divided by ranks on the host).",
         where="dlcomm.kernels.set_num_threads"),
    Knob("build_native", True, parse_bool,
         "Build the native kernels during pip install (0 skips; numpy is used instead).",
         where="setup.py"),
    Knob("allreduce_algorithm", "auto", str,
         "All-reduce algorithm of dlcomm.collectives: auto (ordered, ordered_tcp or "
         "pipelined, chosen per message size by a cost model measured at the first "
         "all-reduce; all reduce every element in rank order, so all-reduce and "
         "reduce-scatter + all-gather give the same bits and every schedule the same model; "
         "the engine's reduce-scatter follows it), ordered (MPI's all-to-all, a rank-order "
         "reduction, MPI's all-gather), ordered_tcp (the same over a TCP mesh whose threads "
         "keep the links busy; see tcp_mesh), pipelined (the same bits, segments sent, "
         "reduced and returned overlapped), fastest (auto's choice among every algorithm, "
         "mpi/ring/ring_tcp/rhd/hierarchical included: results then depend on message size "
         "and fusion, equal to float tolerance only), mpi (MPI's own; 'native' is accepted "
         "too), ring, ring_tcp (the ring over the TCP mesh), rhd, tree, hierarchical (see "
         "docs/collectives.md).",
         where="get_allreduce_algorithm"),
    Knob("tcp_mesh", "auto", str,
         "'auto': the ranks connect to each other over TCP at the first all-reduce and the "
         "cost model may send all-reduces over those connections (ordered_tcp, ring_tcp) "
         "where they beat MPI's own transport; 'off': everything stays on MPI (for networks "
         "where extra TCP ports are not allowed).",
         where="mesh_communicator"),
    Knob("tcp_mesh_send_buffer", 128 << 10, parse_bytes,
         "Send buffer (SO_SNDBUF; Linux doubles it) of each TCP mesh connection, which "
         "bounds the bytes each flow keeps in flight (suffixes k, M allowed). Small buffers "
         "keep the queues at a host's link short when it sends to several peers at once: "
         "on the emulated 4x1gbit an all-to-all reached 0.94 of the link at 128 KiB against "
         "0.88 with the kernel's autotuning (docs/collectives.md). 0: the kernel's autotuning.",
         where="TcpMesh"),
    Knob("mpi_wait", "poll", str,
         "How the data path's MPI all-gathers, all-to-all, broadcasts, barriers and "
         "point-to-point messages wait: 'poll' (non-blocking calls tested between sleeps of "
         "at most 0.2 ms) or 'block' (MPI's blocking calls; MPI's own all-reduce and "
         "reduce-scatter always block). Open MPI's blocking calls spin, so where ranks share "
         "cores a waiting rank takes the CPU of the ranks it waits for: on the emulated "
         "4x1gbit (4 ranks, 2 cores) two ranks computing while the other two waited took "
         "1.8-2x as long under 'block' (docs/collectives.md). 'block' saves up to 0.3 ms "
         "per message on idle cores.",
         where="MPICommunicator"),
    Knob("negotiation", "auto", lambda t: parse_choice(t, NEGOTIATIONS, what="negotiation"),
         "How the engine's ranks agree on what is ready each round: 'mpi' (MPI's "
         "non-blocking all-reduce, tested between sleeps), 'tcp' (over the TCP mesh: the "
         "wait sleeps in a socket read and wakes when the last rank's words arrive) or "
         "'auto': 'tcp' where some machine runs more ranks than it has cores and the ranks "
         "span several hosts (the emulated cluster), else 'mpi'. Each test between sleeps "
         "costs 18-27 microseconds of CPU here, taken from the ranks being waited for where "
         "they share cores (docs/collectives.md). Where the mesh cannot connect, MPI "
         "carries it."),
    Knob("allreduce_segment_bytes", 1 << 20, parse_bytes,
         "Largest message of the pipelined all-reduce (suffixes k, M allowed); raised where a "
         "block would have more than 32 segments. The same on every rank.",
         where="pipelined_allreduce"),
    Knob("compression_cost_cache", "", str,
         "Directory where topk:hierarchical=auto keeps the flat and hierarchical top-k costs "
         "measured per topology (each rank's host, the emulated network, the compressor "
         "spec), so later jobs choose alike without measuring; empty: "
         "~/.cache/dlcomm/compression; 'off': measure in every job.",
         where="HierarchyChoice"),
    Knob("allreduce_model_cache", "", str,
         "Directory where auto/fastest keep the cost model measured per topology (rank "
         "count, each rank's host, the emulated network), so later jobs skip the measurement; "
         "empty: ~/.cache/dlcomm/allreduce; 'off': measure in every job.",
         where="AutoAllreduce"),
    Knob("hierarchical_leader_algorithm", "auto", str,
         "Algorithm among host leaders inside the hierarchical all-reduce: auto (ring or "
         "rhd per message size, from a cost model the leaders measure once), ring, rhd, "
         "tree or mpi.",
         where="HierarchicalAllreduce"),
    Knob("hierarchical_ranks_per_host", 0, lambda t: int(t),
         "Force groups of this many consecutive ranks as 'hosts' (0: shared-memory split); "
         "also the hosts of htopk compression.",
         where="HierarchicalAllreduce"),
    Knob("hierarchical_fp32_accumulation", True, parse_bool,
         "Sum float16 buffers in float32 inside the hierarchical all-reduce: float32 partial "
         "sums inside a host, 16-bit messages between hosts added into a float32 "
         "accumulator, one rounding to 16 bits before the broadcast (the same bytes between "
         "hosts; costs a float32 copy of the buffer, casts, and float32 partial sums over "
         "shared memory). 0: every step sums in float16. See docs/mixed_precision.md.",
         where="HierarchicalAllreduce"),
    Knob("schedule", "wfbp", str,
         "When DistributedOptimizer all-reduces gradients: wfbp (each as backward produces "
         "it), mgwfbp (merged by a measured cost model), dear (reduce-scatter in backward, "
         "all-gather in the next forward), none (after backward). See docs/schedules.md.",
         where="DistributedOptimizer"),
    Knob("fused_update", "off", str,
         "How the wrapped optimizer updates the parameters: off (as the user built it), "
         "foreach (torch's multi-tensor update, bitwise equal to the per-tensor loop), fused "
         "(torch's fused kernel where the optimizer has one, else foreach; rounds differently "
         "from the loop, fastest on CPU). See docs/compression.md.",
         where="DistributedOptimizer"),
    Knob("sync", "bsp", str,
         "How DistributedOptimizer synchronises: bsp (average gradients over all ranks), "
         "dssync:group_size=S (average parameters within shuffled groups of S), "
         "lbbsp:global_batch=B (re-size local batches to measured speeds). See "
         "docs/heterogeneity.md.", where="DistributedOptimizer"),
    Knob("loss_tolerance", 0.0, _non_negative_float,
         "Fraction of gradient elements per step that DistributedOptimizer's DLCP exchange "
         "may leave out (lowest priority, never biases/norms/small tensors; error feedback "
         "keeps them). 0: plain all-reduce.", where="DistributedOptimizer"),
    Knob("dlcp_chunk_elems", 1024, _positive_int,
         "Elements per chunk of the bounded-loss exchange (the unit of priority and loss).",
         where="DistributedOptimizer"),
    Knob("dlcp_channels", 4, _positive_int,
         "Communicators the bounded-loss exchange spreads its chunks over.",
         where="DistributedOptimizer"),
    Knob("dlcp_min_size", 1024, _positive_int,
         "Tensors with fewer elements are never dropped by the bounded-loss exchange.",
         where="DistributedOptimizer"),
    Knob("dear_bucket_size", 4 << 20, parse_bytes,
         "Bytes of gradients fused into one reduce-scatter/all-gather by schedule=dear.",
         where="DistributedOptimizer"),
    Knob("loss_scale_init", 65536.0, _non_negative_float,
         "Initial loss scale of dlcomm.torch.LossScaler (mixed precision): the loss is "
         "multiplied by it before backward; halved after an overflow every rank agrees on.",
         where="dlcomm.torch.LossScaler"),
    Knob("loss_scale_growth_interval", 2000, _positive_int,
         "Steps without overflow after which LossScaler doubles the loss scale.",
         where="dlcomm.torch.LossScaler"),
    Knob("loss_scale_flag", "auto", str,
         "How LossScaler's ranks agree on an overflow: fused (the inf/NaN travels inside the "
         "gradient all-reduce, no extra message; needs no compressor or fp16), separate (each "
         "rank checks its local gradients before sending, one flag is all-reduced with Max), "
         "auto (fused where possible, else separate). See docs/mixed_precision.md.",
         where="dlcomm.torch.LossScaler"),
    Knob("autotune", False, parse_bool,
         "Tune fusion_threshold and cycle_time online by Bayesian optimisation of the "
         "measured step time (rank 0 decides, all ranks apply); needs optuna.",
         where="DistributedOptimizer"),
    Knob("autotune_log", "", str,
         "File rank 0 appends one JSON line per autotune sample to. Empty: no log.",
         where="DistributedOptimizer"),
    Knob("autotune_warmup_steps", 3, lambda t: int(t),
         "Optimizer steps the autotuner ignores before measuring.",
         where="DistributedOptimizer"),
    Knob("autotune_steps_per_sample", 10, _positive_int,
         "Optimizer steps timed for each candidate setting (their median is its cost).",
         where="DistributedOptimizer"),
    Knob("autotune_max_samples", 20, _positive_int,
         "Candidate settings tried before the best is kept for the rest of the run.",
         where="DistributedOptimizer"),
    Knob("fl_state_memory_budget", 1 << 30, parse_bytes,
         "Bytes of client state (SCAFFOLD control variates, a client's own saved arrays) "
         "each rank of a federated simulation keeps in memory; the least recently used "
         "spill to files beyond it (see docs/fl.md).", where="dlcomm.fl.Simulation"),
    Knob("fl_state_dir", "", str,
         "Directory in which a federated run keeps its spilled client state (in a "
         "sub-directory of its own that close() removes), readable by every rank: a shared "
         "file system across hosts. Empty: the system's temporary directory.",
         where="dlcomm.fl.Simulation"),
    Knob("fl_scheduler", "lpt", str,
         "How a federated simulation assigns a round's clients to ranks: lpt (predicted "
         "cost, longest first to the rank that finishes it earliest, then moves and swaps "
         "off the busiest rank) or static (equal-count pieces of the sampled order).",
         where="dlcomm.fl.Simulation"),
    Knob("data_cache_memory_bytes", 1 << 30, parse_bytes,
         "Host memory (a RAM file system, /dev/shm) a SampleCache may fill with decoded "
         "samples, per host: each local rank fills at most its share.",
         where="dlcomm.data.SampleCache"),
    Knob("data_cache_disk_bytes", 4 << 30, parse_bytes,
         "Local disk a SampleCache may fill with the samples that do not fit in memory, per "
         "host (each local rank its share); 0 keeps nothing on disk.",
         where="dlcomm.data.SampleCache"),
    Knob("data_cache_dir", "", str,
         "Directory on local disk for a SampleCache's spilled samples (in a sub-directory "
         "per user and cache name). Empty: the system's temporary directory.",
         where="dlcomm.data.SampleCache"),
    Knob("split_activation_codec", "none", str,
         "How split fine-tuning compresses the activation the edge sends the cloud: none, "
         "fp16, lowrank:rank=R or lowrank:energy=E (per-batch low-rank factors), "
         "topk:ratio=R; ',memory=delta' adds the per-sample correction (see docs/split.md).",
         where="dlcomm.torch.split.SplitModel"),
    Knob("split_gradient_codec", "none", str,
         "How split fine-tuning compresses the activation's gradient the cloud sends back "
         "(same codecs; ',memory=feedback' adds per-sample error feedback).",
         where="dlcomm.torch.split.SplitModel"),
    Knob("split_micro_batches", 1, _positive_int,
         "Pieces each split fine-tuning batch is cut into, so the edge computes the next "
         "piece while the previous one crosses the link and the cloud works on it.",
         where="dlcomm.torch.split.SplitModel"),
    Knob("split_labels", "cloud", str,
         "Where split fine-tuning computes the loss: cloud (the edge sends the labels) or "
         "edge (the cloud sends its output back and the labels never leave the edge).",
         where="dlcomm.torch.split.SplitModel"),
    Knob("split_links", "keep", str,
         "What split fine-tuning does with connections other than the split point's output "
         "that would cross the split (residuals): keep (send them too), reroute (move the "
         "parameter-free operations that join them to the edge, exact) or eliminate (drop the "
         "residual additions on the cloud side).", where="dlcomm.torch.split.SplitModel"),
    Knob("split_cloud_rank", 0, lambda t: int(t),
         "The rank that runs the cloud part of a split model; every other rank is an edge.",
         where="dlcomm.torch.split.SplitModel"),
    Knob("elastic_dead_peer_seconds", 10.0, _positive_float,
         "In elastic jobs (dlcommrun --min-np/--max-np): seconds of silence after which a "
         "peer whose link is cut counts as lost (TCP keepalive probes every second). A "
         "killed process is noticed at once; a peer that is merely computing answers the "
         "probes and is never declared lost."),
)

# Knobs read where they are used (compression, collectives), not by init().
_NOT_INIT = frozenset(k.name for k in KNOBS if k.where != "init")

KNOB_BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}


@dataclasses.dataclass(frozen=True)
class Config:
    """Resolved settings of one ``init()``."""

    cycle_time: float
    fusion_threshold: int
    cache_capacity: int
    stall_warning_seconds: float
    stall_shutdown_seconds: float
    timeline: str
    timeline_mark_cycles: bool
    backend: str
    log_level: str
    compression: str
    negotiation: str
    elastic_dead_peer_seconds: float


def knob_value(name: str, argument: Any = None) -> Any:
    """The value of knob ``name`` read where it is used (not by ``init()``): ``argument``
    unless None, else ``DLCOMM_<NAME>``, else the default; a bad value raises ValueError
    naming where it came from."""
    knob = KNOB_BY_NAME[name]
    if argument is not None:
        raw, source = argument, f"argument {name}="
    elif knob.env in os.environ:
        raw, source = os.environ[knob.env], f"environment variable {knob.env}"
    else:
        return knob.default
    if not isinstance(raw, str) and isinstance(raw, type(knob.default)):
        return raw
    try:
        return knob.parse(str(raw))
    except ValueError as exc:
        raise ValueError(f"bad value {raw!r} for {source}: {exc}") from None


def load_config(env: Mapping[str, str] | None = None, **overrides: Any) -> Config:
    """Build the ``Config``: defaults, then ``DLCOMM_*`` variables, then ``overrides``."""
    env = os.environ if env is None else env
    unknown = set(overrides) - set(KNOB_BY_NAME)
    if unknown:
        raise TypeError(
            f"unknown dlcomm setting(s) {sorted(unknown)}; valid: {sorted(KNOB_BY_NAME)}"
        )
    elsewhere = sorted(k for k in set(overrides) & _NOT_INIT if k != "compression"
                       and overrides[k] is not None)
    if elsewhere:
        knob = KNOB_BY_NAME[elsewhere[0]]
        raise TypeError(f"{knob.name}= is not an init() setting: set {knob.env} or pass it to "
                        f"{knob.where}()")
    values: dict[str, Any] = {}
    for knob in KNOBS:
        if knob.name in _NOT_INIT and knob.name != "compression":
            continue
        if knob.name in overrides and overrides[knob.name] is not None:
            raw = overrides[knob.name]
            source = f"argument {knob.name}="
        elif knob.env in env:
            raw = env[knob.env]
            source = f"environment variable {knob.env}"
        else:
            values[knob.name] = knob.default
            continue
        try:
            values[knob.name] = knob.parse(str(raw)) if not isinstance(raw, bool) else raw
        except ValueError as exc:
            raise ValueError(f"bad value {raw!r} for {source}: {exc}") from None
    if values["backend"] not in {"auto", "mpi", "nccl"}:
        raise ValueError(
            f"bad backend {values['backend']!r} (DLCOMM_BACKEND / backend=); "
            "valid: auto, mpi, nccl"
        )
    return Config(**values)


def knobs_markdown() -> str:
    """The knob table as Markdown, for ``docs/knobs.md``."""
    rows = ["| environment variable | argument | default | meaning |", "|---|---|---|---|"]
    for k in KNOBS:
        default = k.default if k.default != "" else "(empty)"
        rows.append(f"| `{k.env}` | `{k.where}({k.name}=)` | `{default}` | {k.doc} |")
    return "\n".join(rows) + "\n"


def with_knobs_table(document: str) -> str:
    """``document`` (the text of ``docs/knobs.md``) with its knob table, from its header
    row to the first blank line after it, replaced by ``knobs_markdown()``."""
    lines = document.splitlines(keepends=True)
    header = knobs_markdown().splitlines(keepends=True)[0]
    try:
        start = lines.index(header)
    except ValueError:
        raise ValueError("no knob table (its header row) in the document") from None
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return "".join(lines[:start]) + knobs_markdown() + "".join(lines[end:])


if __name__ == "__main__":
    # python -m dlcomm.config [docs/knobs.md]: print the table, or rewrite it in that file.
    import sys

    if len(sys.argv) > 1:
        with open(sys.argv[1]) as f:
            text = with_knobs_table(f.read())
        with open(sys.argv[1], "w") as f:
            f.write(text)
    else:
        print(knobs_markdown(), end="")
