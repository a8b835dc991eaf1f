"""The simulator's iteration arithmetic, methods, compressor models and workloads."""
from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import random
from pathlib import Path

import numpy as np
import pytest

from dlcomm.tools.simulate import collectives as coll
from dlcomm.tools.simulate.compressors import DEFAULT_PARAMS, CompressorModel, MeasuredCost
from dlcomm.tools.simulate.devices import get_device
from dlcomm.tools.simulate.engine import fusion_groups, mgwfbp_groups, simulate_bsp
from dlcomm.tools.simulate.messages import MessageModel
from dlcomm.tools.simulate.methods import (
    ALGORITHM_ALIASES,
    AUTO_CANDIDATES,
    DEFAULT_ALGORITHM,
    Method,
)
from dlcomm.tools.simulate.model_zoo import MODELS, describe, workload_from_description
from dlcomm.tools.simulate.network import CostParams, Network, Topology, preset_params
from dlcomm.tools.simulate.predict import predict
from dlcomm.tools.simulate.workload import Layer, Tensor, Workload

REPO = Path(__file__).resolve().parents[2]
GPU = get_device("v100")


def one_tensor_workload(nbytes: int, forward: float = 0.01, backward: float = 0.02,
                        update: float = 0.003) -> Workload:
    return Workload("one", 8, (Layer("fc", forward, backward,
                                     (Tensor("fc.weight", (nbytes // 4,)),)),), update)


def random_workload(rng: random.Random, layers: int) -> Workload:
    out = []
    for i in range(layers):
        tensors = tuple(Tensor(f"l{i}.t{j}", (rng.choice([1, 10, 1000, 250_000]),))
                        for j in range(rng.randint(0, 3)))
        out.append(Layer(f"l{i}", rng.uniform(0, 5e-3), rng.uniform(0, 1e-2), tensors))
    return Workload("random", 16, tuple(out), rng.uniform(0, 2e-3))


def messages(method: Method, network: Network) -> MessageModel:
    return MessageModel(method, network, GPU)


@pytest.mark.parametrize("p", [2, 4, 5, 16])
def test_one_tensor_without_overlap_is_compute_plus_the_ring(p: int) -> None:
    params = CostParams(alpha=2e-5, beta=8e-9)
    net = Network(Topology(p), params)
    n = 40_000_000
    w = one_tensor_workload(n)
    method = Method(schedule="none", algorithm="ring")
    r = simulate_bsp(w, method, messages(method, net))
    ring = 2 * (p - 1) / p * n * 8e-9 + 2 * (p - 1) * 2e-5
    assert r.iteration_s == pytest.approx(w.compute_s + ring, rel=1e-12)
    assert r.exposed_comm_s == pytest.approx(ring)
    assert r.link_bytes == pytest.approx(2 * (p - 1) / p * n)
    # with one tensor the gradient is ready only at the end: wfbp cannot overlap either
    wfbp = Method(algorithm="ring")
    assert simulate_bsp(w, wfbp, messages(wfbp, net)).iteration_s == pytest.approx(r.iteration_s)


# 10_000_003 float32 elements: blocks of ceil(E / p) elements, counted by hand.
ORDERED_BLOCK_BYTES = {2: 4 * 5_000_002, 3: 4 * 3_333_335, 4: 4 * 2_500_001, 5: 4 * 2_000_001}


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_one_tensor_with_ordered_is_compute_plus_the_ordered_all_reduce(p: int) -> None:
    params = CostParams(alpha=2e-5, beta=8e-9, gamma=1e-9, overhead=1e-4)
    net = Network(Topology(p), params)
    w = one_tensor_workload(4 * 10_000_003)
    method = Method(schedule="none", algorithm="ordered")
    r = simulate_bsp(w, method, messages(method, net))
    block = ORDERED_BLOCK_BYTES[p]
    # all-to-all and all-gather: p - 1 messages of the largest block each; p - 1 sums of it
    ordered = 1e-4 + 2 * (p - 1) * (2e-5 + block * 8e-9) + (p - 1) * block * 1e-9
    assert r.iteration_s == pytest.approx(w.compute_s + ordered, rel=1e-12)
    assert r.link_bytes == pytest.approx(2 * (p - 1) * block)


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_one_tensor_with_the_default_is_the_faster_of_ordered_and_ordered_tcp(p: int) -> None:
    params = CostParams(alpha=2e-5, beta=8e-9, gamma=1e-9, overhead=1e-4)
    net = Network(Topology(p), params)
    w = one_tensor_workload(4 * 10_000_003)
    block = ORDERED_BLOCK_BYTES[p]
    # the mesh sends a rank's p - 1 blocks at once: one latency per half, the same bytes
    mesh = 1e-4 + 2 * (2e-5 + (p - 1) * block * 8e-9) + (p - 1) * block * 1e-9
    tcp = Method(schedule="none", algorithm="ordered_tcp")
    r = simulate_bsp(w, tcp, messages(tcp, net))
    assert r.iteration_s == pytest.approx(w.compute_s + mesh, rel=1e-12)
    assert r.link_bytes == pytest.approx(2 * (p - 1) * block)
    default = Method(schedule="none")
    assert default.algorithm == "auto"
    times = {a: simulate_bsp(w, m, messages(m, net)).iteration_s
             for a, m in (("auto", default), ("tcp", tcp),
                          ("ordered", Method(schedule="none", algorithm="ordered")))}
    assert times["auto"] == min(times["tcp"], times["ordered"])
    # with p - 1 latencies saved per half, the mesh is the faster here beyond 2 ranks
    assert (times["auto"] == times["tcp"] < times["ordered"]) if p > 2 else \
        times["tcp"] == times["ordered"]


def test_dear_reduce_scatters_with_the_engines_reduce_scatter() -> None:
    net = Network(Topology(4, 2), CostParams(alpha=1e-5, beta=8e-9, gamma=1e-9))
    bucket = 4 * 1_000_001
    ordered = messages(Method(schedule="dear", algorithm="ordered"), net).reduce_scatter(bucket)
    assert ordered.seconds == pytest.approx(
        coll.ordered_reduce_scatter(bucket, Topology(4, 2)).seconds(net.params))
    mesh = messages(Method(schedule="dear", algorithm="ordered_tcp"), net).reduce_scatter(bucket)
    assert mesh.seconds == pytest.approx(
        coll.ordered_tcp_reduce_scatter(bucket, Topology(4, 2)).seconds(net.params))
    assert mesh.link_bytes == pytest.approx(ordered.link_bytes)  # the same blocks, at once
    assert mesh.seconds < ordered.seconds
    # auto reduce-scatters with the all-reduce it picks at that size. On 4 hosts x 2 slots
    # that is ordered's: its ring all-gather puts 7 blocks on a host's link, the mesh's 12.
    topo = Topology(4, 2)
    assert coll.ordered_allreduce(bucket, topo).seconds(net.params) < \
        coll.ordered_tcp_allreduce(bucket, topo).seconds(net.params)
    auto = messages(Method(schedule="dear"), net).reduce_scatter(bucket)
    assert auto.seconds == ordered.seconds
    one_slot = Network(Topology(4), net.params)  # one rank per host: the mesh's
    assert messages(Method(schedule="dear"), one_slot).reduce_scatter(bucket).seconds == \
        messages(Method(schedule="dear", algorithm="ordered_tcp"),
                 one_slot).reduce_scatter(bucket).seconds
    for algorithm in ("ring", "rhd", "tree", "hierarchical", "mpi"):
        other = messages(Method(schedule="dear", algorithm=algorithm), net)
        assert other.reduce_scatter(bucket).seconds == pytest.approx(  # MPI's own
            coll.ring_reduce_scatter(bucket, Topology(4, 2)).seconds(net.params))
    # on 4 hosts x 2 slots the all-to-all sends 6 of every rank's 7 blocks off the host
    assert ordered.link_bytes > other.reduce_scatter(bucket).link_bytes


def test_mgwfbp_fits_its_line_through_the_probe_sizes_as_dlcomm_does() -> None:
    net = Network(Topology(8), CostParams(alpha=1e-4, beta=8e-9, gamma=1e-9, overhead=2e-4))
    ring = messages(Method(algorithm="ring"), net)
    a, b = ring.alpha_beta()  # ring's time is linear in the bytes: the line is exact
    assert a == pytest.approx(2e-4 + 14 * 1e-4)
    assert b == pytest.approx(2 * 7 / 8 * 8e-9 + 7 / 8 * 1e-9)
    ordered = messages(Method(), net)
    sizes = np.array([4 << 10, 64 << 10, 512 << 10, 2 << 20], dtype=float)
    times = np.array([ordered.dense_allreduce(s).seconds for s in sizes])
    slope, intercept = np.polyfit(sizes, times, 1)
    assert ordered.alpha_beta() == pytest.approx((intercept, slope))
    torch_model = pytest.importorskip("dlcomm.torch.schedules.cost_model")
    assert tuple(torch_model.DEFAULT_PROBE_BYTES) == tuple(int(s) for s in sizes)
    fitted = torch_model.fit_alpha_beta(sizes, times)
    assert ordered.alpha_beta() == pytest.approx((fitted.alpha, fitted.beta))


@pytest.mark.parametrize("seed", range(25))
def test_overlap_never_makes_an_iteration_slower(seed: int) -> None:
    rng = random.Random(seed)
    w = random_workload(rng, rng.randint(1, 12))
    if not w.tensors:
        w = dataclasses.replace(w, layers=(*w.layers, Layer("x", 1e-3, 1e-3,
                                                            (Tensor("x.w", (100,)),))))
    topo = Topology(rng.choice([2, 4, 8]), rng.choice([1, 2]))
    # Linear costs (no per-message term): sending as soon as gradients are ready can only
    # finish earlier than sending the same bytes after backward.
    linear = Network(topo, CostParams(beta=rng.choice([1e-10, 1e-9, 8e-9]), gamma=1e-10))
    none = Method(schedule="none")
    for schedule in ("wfbp", "mgwfbp"):
        m = Method(schedule=schedule)
        assert simulate_bsp(w, m, messages(m, linear)).iteration_s <= \
            simulate_bsp(w, none, messages(none, linear)).iteration_s * (1 + 1e-12)
    # With start-up costs MG-WFBP's plan still never loses to one message after backward.
    latency = Network(topo, CostParams(alpha=rng.choice([1e-5, 1e-3]), beta=8e-9,
                                       overhead=rng.choice([0.0, 1e-4])))
    m = Method(schedule="mgwfbp")
    assert simulate_bsp(w, m, messages(m, latency)).iteration_s <= \
        simulate_bsp(w, none, messages(none, latency)).iteration_s * (1 + 1e-9)
    # and no schedule beats computing alone
    for schedule in ("none", "wfbp", "mgwfbp", "dear"):
        m = Method(schedule=schedule)
        assert simulate_bsp(w, m, messages(m, latency)).iteration_s >= w.compute_s * (1 - 1e-12)


def test_dear_hides_the_all_gather_behind_the_next_forward() -> None:
    # ten equal layers: DeAR keeps the link busy during the forward pass, WFBP leaves it idle
    layers = tuple(Layer(f"l{i}", 0.01, 0.02, (Tensor(f"l{i}.w", (1_000_000,)),))
                   for i in range(10))
    w = Workload("ten", 32, layers, 0.0)
    net = Network(Topology(8), CostParams(beta=8e-9))  # communication-bound
    wfbp, dear = Method(), Method(schedule="dear", dear_bucket_size=4_000_000)
    t_wfbp = simulate_bsp(w, wfbp, messages(wfbp, net)).iteration_s
    t_dear = simulate_bsp(w, dear, messages(dear, net)).iteration_s
    assert t_dear < t_wfbp


def test_mgwfbp_plan_equals_the_torch_adapters() -> None:
    pytest.importorskip("torch")
    from dlcomm.torch.schedules.cost_model import AlphaBeta
    from dlcomm.torch.schedules.mgwfbp import plan_merged_groups

    rng = random.Random(3)
    for _ in range(50):
        n = rng.randint(1, 30)
        ready = sorted(rng.uniform(0, 0.1) for _ in range(n))
        sizes = [rng.choice([4e2, 4e4, 4e6]) for _ in range(n)]
        a, b = rng.choice([0.0, 1e-4, 5e-3]), rng.choice([1e-10, 1e-9, 8e-9])
        assert mgwfbp_groups(ready, sizes, a, b) == plan_merged_groups(ready, sizes,
                                                                       AlphaBeta(a, b))


def test_fusion_groups_respect_the_threshold() -> None:
    assert fusion_groups([0, 1, 2, 3], [3.0, 3.0, 10.0, 1.0], 6.0) == [[0, 1], [2], [3]]
    assert fusion_groups([], [], 6.0) == []
    assert fusion_groups([2, 0], [1.0, 1.0, 1.0], 0.0) == [[2], [0]]


def test_same_inputs_same_outputs() -> None:
    w = workload_from_description(describe("resnet50"), 64, GPU)
    net = Network(Topology.for_workers(64, 4), preset_params("10gbe"))
    for text in ("dense", "dense dear", "dense mgwfbp", "acpsgd:rank=4", "topk:ratio=0.01",
                 "gtopk:ratio=0.01", "dssync:group_size=2", "dense hierarchical"):
        a = predict(w, Method.parse(text), net, GPU).to_dict()
        b = predict(w, Method.parse(text), net, GPU).to_dict()
        assert a == b


ALL_METHODS = (
    "dense", "dense schedule=none", "dense mgwfbp", "dense dear", "dense rhd", "dense mpi",
    "dense ring", "dense ring dear",
    "dense tree", "dense hierarchical", "fp16", "bf16", "topk:ratio=0.01",
    "topk:ratio=0.01,approx=1", "randomk:ratio=0.01", "gtopk:ratio=0.01", "efsignsgd", "signum",
    "qsgd:levels=16", "powersgd:rank=4", "acpsgd:rank=4", "powersgd:rank=4+fp16",
    "dssync:group_size=2", "lbbsp", "loss_tolerance=0.1")


@pytest.mark.parametrize("text", ALL_METHODS)
def test_more_bandwidth_is_never_slower(text: str) -> None:
    w = workload_from_description(describe("resnet50"), 32, GPU)
    method = Method.parse(text)
    times = []
    for network in ("1gbe", "10gbe", "25gbe", "100gbib"):
        net = Network(Topology.for_workers(16, 4), preset_params(network))
        times.append(predict(w, method, net, GPU, iterations=30).iteration_s)
    # the presets also lower the latency as the rate rises
    assert all(b <= a * (1 + 1e-12) for a, b in zip(times, times[1:])), times


def test_more_compression_never_sends_more_bytes() -> None:
    w = workload_from_description(describe("resnet50"), 32, GPU)
    net = Network(Topology.for_workers(16, 2), preset_params("10gbe"))

    def link(text: str) -> float:
        return predict(w, Method.parse(text), net, GPU).link_bytes

    for family in ("topk", "randomk", "gtopk"):
        sent = [link(f"{family}:ratio={r}") for r in (0.1, 0.01, 0.001)]
        assert sent == sorted(sent, reverse=True) and sent[-1] < link("dense")
    for family in ("powersgd", "acpsgd"):
        sent = [link(f"{family}:rank={r}") for r in (16, 4, 1)]
        assert sent == sorted(sent, reverse=True)
    assert link("fp16") < link("dense") and link("powersgd:rank=4+fp16") < link("powersgd:rank=4")
    assert link("acpsgd:rank=4") < link("powersgd:rank=4")


@pytest.mark.parametrize("spec", ["none", "fp16", "bf16", "topk:ratio=0.01", "randomk:ratio=0.05",
                                  "gtopk:ratio=0.02", "efsignsgd", "signum", "qsgd:levels=16",
                                  "qsgd:levels=300", "powersgd:rank=4", "acpsgd:rank=3",
                                  "powersgd:rank=4+fp16", "topk:ratio=0.01+fp16"])
@pytest.mark.parametrize("shape", [(64, 3, 3, 3), (1000, 200), (4096,), (7, 5000)])
def test_payload_sizes_match_the_library(spec: str, shape: tuple[int, ...]) -> None:
    from dlcomm.compression.registry import get_compressor

    model = CompressorModel.parse(spec)
    tensor = Tensor("t", shape)
    lib = get_compressor(spec, min_compress_size=0, compress_1d=True)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    payloads, ctx = lib.compress(x, "t")
    got = [sum(p.nbytes for p in payloads)]
    for _ in model.rounds[1:]:
        payloads, ctx = lib.resume(payloads, ctx)
        got.append(sum(p.nbytes for p in payloads))
    assert [b for _, b in model.round_payloads(tensor, 0)] == got
    assert [k for k, _ in model.round_payloads(tensor)] == list(lib.rounds)
    if spec.startswith("acpsgd"):  # the next step sends the other factor
        payloads, _ = lib.compress(x, "t")
        assert model.round_payloads(tensor, 1)[0][1] == sum(p.nbytes for p in payloads)


def test_compressor_defaults_are_the_librarys() -> None:
    from dlcomm.compression.registry import REGISTRY

    for name, params in DEFAULT_PARAMS.items():
        signature = inspect.signature(REGISTRY[name].factory.__init__)
        for key, value in params.items():
            assert signature.parameters[key].default == value, (name, key)
    assert CompressorModel.parse("powersgd").summable and not CompressorModel.parse("topk").summable


def test_methods_refuse_what_dlcomm_refuses() -> None:
    with pytest.raises(ValueError, match="dear takes no compression"):
        Method.parse("topk:ratio=0.01 dear")
    with pytest.raises(ValueError, match="leave schedule at wfbp"):
        Method.parse("dssync:group_size=2 schedule=none")
    with pytest.raises(ValueError, match="schedule=none"):
        Method.parse("none")
    with pytest.raises(ValueError, match="unknown compressor"):
        Method.parse("zip:level=9")
    with pytest.raises(ValueError, match="valid parameters"):
        Method.parse("topk:k=5")
    with pytest.raises(ValueError, match="loss_tolerance"):
        Method.parse("loss_tolerance=1.5")
    with pytest.raises(ValueError, match="group_size"):
        Method.parse("dssync")
    m = Method.parse("acpsgd:rank=8 fusion_threshold=4M hierarchical leader_algorithm=rhd")
    assert (m.compression, m.fusion_threshold, m.algorithm, m.leader_algorithm) == \
        ("acpsgd:rank=8", 4 << 20, "hierarchical", "rhd")
    assert m.name == "acpsgd:rank=8 hierarchical"
    assert Method.parse("dense schedule=none").schedule == "none"


def test_the_default_algorithm_is_the_engines_and_native_is_mpi() -> None:
    # the library's collectives start MPI when imported: only in the test that compares
    from dlcomm.collectives.registry import ALIASES, DEFAULT_ALLREDUCE_ALGORITHM

    # the engine's default is modelled as itself: the faster of its candidates at each size
    assert DEFAULT_ALLREDUCE_ALGORITHM == DEFAULT_ALGORITHM == Method().algorithm == "auto"
    assert ALIASES.items() <= ALGORITHM_ALIASES.items()
    from dlcomm.collectives.selection import DETERMINISTIC_CANDIDATES

    # auto's candidates, pipelined charged as ordered
    assert {ALGORITHM_ALIASES.get(a, a) for a in DETERMINISTIC_CANDIDATES} == \
        set(AUTO_CANDIDATES)
    assert Method(algorithm="pipelined") == Method(algorithm="ordered")
    assert Method.parse("dense").algorithm == "auto" and Method.parse("dense").name == "dense"
    for text in ("dense native", "dense mpi", "dense algorithm=native", "dense algorithm=MPI"):
        m = Method.parse(text)
        assert m.algorithm == "mpi" and m.name == "dense mpi", text
    assert Method(algorithm="native") == Method(algorithm="mpi")
    assert Method.parse("dense", algorithm="ring").name == "dense ring"
    assert Method.parse("dense tree", algorithm="ring").algorithm == "tree"  # the text wins
    with pytest.raises(ValueError, match="native = mpi"):
        Method(algorithm="nccl")
    # mpi is MPI's own: the faster of ring and halving-doubling at each size
    net = Network(Topology(6), CostParams(alpha=1e-4, beta=8e-9, gamma=1e-9))
    mpi = messages(Method(algorithm="native"), net)
    for n in (1e3, 1e5, 1e8):
        assert mpi.dense_allreduce(n).seconds == pytest.approx(min(
            coll.ring_allreduce(n, net.topology).seconds(net.params),
            coll.rhd_allreduce(n, net.topology).seconds(net.params)))


def test_summable_compressors_fuse_and_the_others_batch_each_round() -> None:
    topo = Topology(8)
    net = Network(topo, CostParams(alpha=1e-3))  # latency only: count messages
    tensors = [Tensor(f"t{i}", (100, 100)) for i in range(5)] + [Tensor("b", (100,))]
    cost = {}
    for text in ("dense", "acpsgd:rank=4", "powersgd:rank=4", "topk:ratio=0.01",
                 "gtopk:ratio=0.01"):
        m = Method.parse(text, algorithm="ring")  # one latency count whatever the size
        message = MessageModel(m, net, GPU).group(tensors)
        cost[text] = message.seconds - message.compute_s

    def seconds(c: coll.Cost) -> float:
        return c.seconds(net.params)

    ring_latency = seconds(coll.ring_allreduce(1.0, topo))
    mpi_allreduce = min(ring_latency, seconds(coll.rhd_allreduce(1.0, topo)))
    allgather = min(seconds(coll.ring_allgather(1.0, topo)),
                    seconds(coll.bruck_allgather(1.0, topo))) + seconds(coll.size_exchange(topo))
    assert cost["dense"] == pytest.approx(ring_latency)
    assert cost["acpsgd:rank=4"] == pytest.approx(ring_latency)  # one fused round
    assert cost["powersgd:rank=4"] == pytest.approx(2 * ring_latency)
    # the engine's run_rounds: the five tensors' payloads in one all-gather, the bias dense
    assert cost["topk:ratio=0.01"] == pytest.approx(allgather + mpi_allreduce)
    # gTop-k: the bias dense in the first round, beside one merge tree for all five; then one
    # all-reduce of every tensor's k values
    merge = seconds(coll.gtopk_merge_tree(1.0, topo))
    assert cost["gtopk:ratio=0.01"] == pytest.approx(merge + 2 * mpi_allreduce)


def test_busy_calls_add_a_wait_per_collective_and_negotiation_of_compressing_groups() -> None:
    net = Network(Topology(4), preset_params("1gbe"))
    tensors = [Tensor(f"t{i}", (300, 300)) for i in range(3)] + [Tensor("b", (300,))]
    busy = 0.01
    for text, calls, waits in (("dense", 1, 0), ("topk:ratio=0.01", 2, 3),
                               ("powersgd:rank=4", 2, 3), ("gtopk:ratio=0.01", 3, 4),
                               ("fp16", 1, 2)):
        method = Method.parse(text)
        quiet = MessageModel(method, net, GPU).group(tensors)
        crowded = MessageModel(method, net, GPU, busy_call_s=busy).group(tensors)
        assert quiet.calls == crowded.calls == calls, text
        # a compressing group: each call and its negotiation wait; a dense one: none. The
        # compression and the bytes do not change.
        assert crowded.seconds - quiet.seconds == pytest.approx(busy * waits), text
        assert crowded.compute_s == quiet.compute_s and crowded.link_bytes == quiet.link_bytes
    # a compressor measured as costing nothing still compresses: it waits all the same
    free = {"randomk:ratio=0.01": MeasuredCost(0.0, 0.0)}
    randomk = Method.parse("randomk:ratio=0.01")
    crowded = MessageModel(randomk, net, GPU, free, busy_call_s=busy).group(tensors)
    quiet = MessageModel(randomk, net, GPU, free).group(tensors)
    assert quiet.compute_s == 0 and quiet.calls == 1
    assert crowded.seconds - quiet.seconds == pytest.approx(busy * 2)
    # dense alone in a group of a compressing method (too small to compress): no wait
    small = [Tensor("b", (300,))]
    topk = Method.parse("topk:ratio=0.01")
    assert MessageModel(topk, net, GPU, busy_call_s=busy).group(small).seconds == \
        pytest.approx(MessageModel(topk, net, GPU).group(small).seconds)
    # DeAR's halves are dense: no wait either
    dear = MessageModel(Method.parse("dense"), net, GPU, busy_call_s=busy)
    quiet_dear = MessageModel(Method.parse("dense"), net, GPU)
    assert dear.reduce_scatter(1e6).seconds == pytest.approx(
        quiet_dear.reduce_scatter(1e6).seconds)
    assert dear.all_gather(1e6).seconds == pytest.approx(
        quiet_dear.all_gather(1e6).seconds)
    assert MessageModel(Method.parse("dense"), net, GPU, busy_call_s=busy).group([]).seconds == 0
    for bad in (-1e-3, float("inf"), True, "1"):
        with pytest.raises(ValueError, match="busy_call_s must be"):
            MessageModel(Method.parse("dense"), net, GPU, busy_call_s=bad)


def test_compression_on_the_device_delays_the_iteration() -> None:
    w = workload_from_description(describe("resnet50"), 64, GPU)
    net = Network(Topology.for_workers(16, 4), preset_params("100gbib"))
    method = Method.parse("powersgd:rank=4")
    shared = predict(w, method, net, GPU).iteration_s
    own_core = predict(w, method, net, GPU, compression_on_device=False).iteration_s
    assert shared > own_core >= w.compute_s


def test_ranks_sharing_cores_stretch_compression_not_the_wire() -> None:
    tensors = [Tensor(f"t{i}", (300, 300)) for i in range(3)] + [Tensor("b", (300,))]
    net = Network(Topology(4), preset_params("1gbe"))
    for text in ("dense", "topk:ratio=0.01", "powersgd:rank=4", "fp16"):
        method = Method.parse(text)
        alone = MessageModel(method, net, GPU).group(tensors)
        shared = MessageModel(method, net, GPU, cpu_share=2.5).group(tensors)
        assert shared.compute_s == pytest.approx(2.5 * alone.compute_s)
        assert shared.seconds - shared.compute_s == pytest.approx(
            alone.seconds - alone.compute_s)  # the collectives cost the same
        assert shared.link_bytes == alone.link_bytes
    w = workload_from_description(describe("mnist-mlp"), 32, GPU)
    method = Method.parse("topk:ratio=0.01")
    assert predict(w, method, net, GPU, cpu_share=2).iteration_s > \
        predict(w, method, net, GPU).iteration_s
    assert predict(w, Method.parse("dense"), net, GPU, cpu_share=2).iteration_s == \
        predict(w, Method.parse("dense"), net, GPU).iteration_s
    for bad in (0.5, 0, float("nan"), True, "2"):
        with pytest.raises(ValueError, match="cpu_share must be a number >= 1"):
            predict(w, method, net, GPU, cpu_share=bad)


def test_model_zoo_parameter_counts() -> None:
    known = {"resnet50": 25_557_032, "resnet101": 44_549_160, "resnet152": 60_192_808,
             "vgg16": 138_357_544, "alexnet": 61_100_840, "bert-base": 109_482_240,
             "bert-large": 335_141_888}
    for name, count in known.items():
        assert describe(name).parameters == count, name
    assert set(known) < set(MODELS)
    with pytest.raises(ValueError, match="described models"):
        describe("gpt-5")


def _load_example(name: str):  # noqa: ANN202 - a module
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_models_match_their_descriptions() -> None:
    pytest.importorskip("torch")
    mnist = _load_example("torch_mnist")
    synthetic = _load_example("torch_synthetic_benchmark")
    for name, model in (("mnist-mlp", mnist.MLP(28)), ("mnist-cnn", mnist.Net(28)),
                        ("synthetic-mlp", synthetic.MODELS["mlp"]()),
                        ("synthetic-cnn", synthetic.MODELS["cnn"]())):
        described = {t.name: t.shape for layer in describe(name).layers for t in layer.tensors}
        real = {n: tuple(p.shape) for n, p in model.named_parameters()}
        assert described == real, name


def test_workload_json_round_trip_and_rescaling(tmp_path: Path) -> None:
    w = workload_from_description(describe("mnist-cnn"), 32, get_device("cpu-core"))
    w.save(tmp_path / "w.json")
    assert Workload.load(tmp_path / "w.json") == w
    r = w.with_compute(0.5, update_s=0.01)
    assert r.forward_s + r.backward_s == pytest.approx(0.5) and r.update_s == 0.01
    assert r.layers[0].forward_s / r.layers[1].forward_s == pytest.approx(
        w.layers[0].forward_s / w.layers[1].forward_s)
    assert w.scaled(2.0).compute_s == pytest.approx(w.compute_s + w.forward_s + w.backward_s)
    with pytest.raises(ValueError, match="unique"):
        Workload("x", 1, (Layer("a", 0, 0, (Tensor("t", (1,)),)),
                          Layer("b", 0, 0, (Tensor("t", (1,)),))))
    with pytest.raises(ValueError, match="lacks the field"):
        Workload.from_dict({"name": "x"})


def test_measured_compressor_costs_replace_the_estimate() -> None:
    from dlcomm.tools.simulate.compressors import MeasuredCost

    measured = {"topk:ratio=0.01": MeasuredCost(1e-5, 1e-9),
                "topk:ratio=0.01,approx=1": MeasuredCost(2e-5, 5e-10)}
    t = Tensor("x", (1000, 1000))
    cpu = get_device("cpu-core")

    def cost(spec: str) -> float:
        return CompressorModel.parse(spec).compute_seconds(t, 1, cpu, measured)

    assert cost("topk:ratio=0.01") == pytest.approx(1e-5 + 1e-3)
    assert cost("topk:ratio=0.001") == cost("topk:ratio=0.01")  # same compressor, other k
    assert cost("topk:ratio=0.001,approx=1") == pytest.approx(2e-5 + 5e-4)
    estimated = CompressorModel.parse("powersgd").compute_seconds(t, 1, cpu)
    assert cost("powersgd") == estimated > 0  # not measured: the device's estimate
    assert CompressorModel.parse("none").compute_seconds(t, 8, cpu, measured) == 0.0
