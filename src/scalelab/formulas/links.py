"""Links between GPUs and what a collective costs on one.

A ``Link`` is a **bus bandwidth per GPU, unidirectional, in bytes/s**, and a **latency per
collective call, in seconds**: the two numbers of the latency-bandwidth (alpha-beta) model

    collective_seconds = latency_s + bus_factor(collective, n) x nbytes / (bandwidth_Bps x efficiency)

in nccl-tests' convention (NVIDIA/nccl-tests, doc/PERFORMANCE.md): ``nbytes`` is the buffer size
of nccl-tests' "size" column, the whole buffer a rank holds before or after the collective:

* all_reduce: the buffer reduced (input = output), bus factor 2 (n-1)/n;
* reduce_scatter: the whole input (n x the shard each rank ends with), bus factor (n-1)/n;
* all_gather: the whole output (n x the shard each rank contributes), bus factor (n-1)/n;
* broadcast: the buffer sent from the root, bus factor 1.

The bus bandwidth is what nccl-tests' ``busbw`` column reports: within a node comparable with a
link's per-GPU datasheet figure; between nodes with that of the NICs a group's ranks hold on one
node together (across_nodes). A measured
bench table (``scalelab bench comm``) fits straight to a Link (``scalelab.formulas.link_fit.fit_link``,
efficiency 1: it is already what the link achieves).

Nominal figures are datasheet line rates; NCCL reaches less. ``efficiency`` is the achievable
bus bandwidth over the nominal one, DEFAULT_EFFICIENCY unless given (see its note). Latencies
of the products are the order of nccl-tests' small-message times (see LATENCY_*): an assumption
to calibrate, not a measurement.

A step's collectives (collective_sizes, collective_calls, at the end) turn scalelab.formulas.communication's
exact bytes per step into the sizes and calls this model times: scalelab.results.prediction and
``scalelab estimate scaling`` both read them.

A collective whose group spans nodes runs on its rails (across_nodes): NCCL gives each NIC of a node a
ring channel of its own, so the group's bus bandwidth is the inter-node link's per-GPU figure times the
group's ranks on each node, up to the link within the node. Across nodes NCCL runs an all-reduce as a ring or
as a tree, whichever its tuner times faster, and a reduce-scatter or an all-gather as a ring only
(nccl_latency_s: NCCL's own latency model). Where the link is a fabric measured at several node counts
(``busbw:GBPS/RANKS,...``), an all-reduce tree reaches what one group reached at its node count, whatever the
other groups do at the same time, up to its own NICs, while the rings of a reduce-scatter or an all-gather stay on
their rails (across_nodes says why).

Out of scope: NVLink SHARP and in-network reductions, topology beyond one NIC per GPU (a node's NICs
shared, oversubscribed spines), and the protocols below Simple (LL, LL128) that small messages use.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from scalelab.config import ModelConfig
from scalelab.formulas import communication
from scalelab.formulas.rank_step import RankStep
from scalelab.registries.families import family
from scalelab.registries.precisions import PRECISIONS
from scalelab.registries.strategies import strategy

GB = 1e9
"""Decimal gigabyte: link bandwidths are quoted in GB/s (10^9 bytes/s) and Gb/s."""

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
"""The collectives the model times (the names torch.distributed and nccl-tests use, underscored)."""

DEFAULT_EFFICIENCY = 0.8
"""Achievable bus bandwidth over the nominal line rate, applied to products and numbers.

NCCL's maintainers put the protocol overhead on NVLink at about 20%: an effective 370 GB/s of
H100's 450 GB/s line rate, seen as busbw of ring collectives (NVIDIA/nccl-tests#212,
https://github.com/NVIDIA/nccl-tests/issues/212). On InfiniBand NDR they expect 46-48 GB/s per
400 Gb/s NIC, 0.92-0.96 (https://github.com/NVIDIA/nccl-tests/issues/290). 0.8 is the
conservative of the two; override it (``--link-efficiency``) or measure (``bench comm``)."""

LATENCY_INTRA_S = 10e-6
"""Assumed latency of one collective call within a node (NVLink, PCIe): the order of
nccl-tests' small-message all_reduce times on one 8-GPU node (a few to a few tens of us)."""
LATENCY_INTER_S = 50e-6
"""Assumed latency of one collective call across nodes (InfiniBand, RoCE): nccl-tests'
4-byte all_reduce took 46-48 us on 2 nodes x 8 H20 over NDR (https://github.com/NVIDIA/nccl/issues/1244)."""
LATENCY_NUMBER_S = LATENCY_INTER_S
"""Latency of a link given as a bare bandwidth (``--inter-node 50``): the larger assumption."""


@dataclass(frozen=True)
class Link:
    """A link as the alpha-beta model sees it."""

    name: str
    bandwidth_Bps: float
    """Bus bandwidth per GPU, unidirectional, bytes/s: nominal (a datasheet) or measured (a fit)."""
    latency_s: float
    """Seconds per collective call, whatever its size (alpha)."""
    source: str
    """Where the figures come from: a datasheet, a URL, "given on the command line", a bench table."""
    efficiency: float = 1.0
    """Achievable over nominal bandwidth: the fraction collective_seconds runs at (1 for measured links)."""
    per_nic: bool = False
    """The figure is one GPU's own NIC (a product with a NIC per GPU, a number given per GPU): a group that spans
    nodes runs over as many as it has ranks on each node (across_nodes). False for a bench table's fit: the bus
    bandwidth its groups reached, as they were laid out."""
    fabric: tuple[tuple[int, float], ...] = ()
    """A fabric measured at several node counts: (nodes, the all-reduce bus bandwidth in bytes/s nccl-tests printed
    over every GPU of them), by nodes (measured_busbw). Empty: the figure above holds at every count."""
    span: tuple[int, int] | None = None
    """(ranks per node, nodes) of the group across_nodes resolved this link for: its collectives pay NCCL's
    latency for that shape (nccl_latency_s) instead of latency_s."""
    tree_Bps: float | None = None
    """What an all-reduce tree reaches on this span where it differs from the rings' bandwidth (across_nodes)."""

    def __post_init__(self):
        for field, value in (("bandwidth_Bps", self.bandwidth_Bps), ("efficiency", self.efficiency)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"link {self.name!r}: {field} must be a positive number, got {value!r}")
        if self.efficiency > 1:
            raise ValueError(f"link {self.name!r}: efficiency is a fraction of the nominal bandwidth, in (0, 1], "
                             f"got {self.efficiency!r}")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ValueError(f"link {self.name!r}: latency_s must be >= 0 seconds, got {self.latency_s!r}")

    @property
    def achievable_Bps(self) -> float:
        """The bus bandwidth collectives run at: bandwidth_Bps x efficiency."""
        return self.bandwidth_Bps * self.efficiency

    def with_efficiency(self, efficiency: float) -> Link:
        return replace(self, efficiency=efficiency)


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw x factor, algbw = nbytes / time."""
    if n < 1 or int(n) != n:
        raise ValueError(f"a collective's group has a whole number >= 1 of ranks, got {n!r}")
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("reduce_scatter", "all_gather"):
        return (n - 1) / n
    if collective == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")


HANDED_PER_SIZE = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1, "broadcast": 1}
"""Bytes in scalelab's communication unit (scalelab.formulas.communication) (the ZeRO paper's, what CommCounter counts: an all-reduce of
S bytes counts 2S, an all-gather its output, a reduce-scatter its input, a broadcast its tensor)
per byte of nccl-tests' size."""


def handed_per_size(collective: str) -> int:
    if collective not in HANDED_PER_SIZE:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    return HANDED_PER_SIZE[collective]


def collective_seconds(collective: str, nbytes: float, n: int, link: Link) -> float:
    """Predicted seconds of one collective call over ``n`` ranks on ``link``:
    latency + bus_factor x nbytes / achievable bus bandwidth. ``nbytes`` is nccl-tests' "size"
    (module doc: the whole buffer; for all_gather the gathered output). A one-rank group
    moves nothing and costs nothing (FSDP2 issues no collective there)."""
    factor = bus_factor(collective, n)
    if not (math.isfinite(nbytes) and nbytes >= 0):
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    if n == 1:
        return 0.0
    if link.span is None:
        return link.latency_s + factor * nbytes / link.achievable_Bps
    per_node, nodes = link.span
    ring = nccl_latency_s(collective, "ring", n, nodes) + factor * nbytes / link.achievable_Bps
    if collective != "all_reduce":  # reduce-scatter, all-gather and broadcast have no tree between nodes
        return ring
    tree = nccl_latency_s(collective, "tree", n, nodes) + factor * nbytes / (link.tree_Bps or link.achievable_Bps)
    return min(ring, tree)  # NCCL's tuner runs the algorithm it times faster


NCCL_LATENCY_US = {"base": 8.4, "ring_step_in_node": 3.4, "tree_step_in_node": 4.0, "step_between_nodes": 14.0}
"""NCCL's latency model of a call (its Simple protocol, the one large messages use), microseconds: a base per call, and
per step of the algorithm within a node (NVLink) or between nodes (the network), from NCCL's tuner defaults
(baseLatencies, hwLatencies; a ring's step within a node is at least 3 x the network overhead of 1 us there):
https://github.com/NVIDIA/nccl/blob/master/src/graph/tuning.cc"""


def nccl_latency_s(collective: str, algorithm: str, ranks: int, nodes: int) -> float:
    """Seconds of NCCL's latency model for one call over ``ranks`` ranks on ``nodes`` nodes (tuning.cc, NCCL_LATENCY_US):
    a ring all-reduce takes 2 (ranks - 1) steps, a reduce-scatter or an all-gather ranks - 1, of which 2 (nodes - 1)
    or nodes - 1 cross between nodes: linear in the ranks; a tree all-reduce goes up and down a chain within each
    node and a binary tree across nodes, 2 ((ranks per node - 1) + log2 nodes) steps: logarithmic in the nodes; a
    broadcast, a pipelined chain, one step."""
    lat = NCCL_LATENCY_US
    if collective == "broadcast":  # a pipelined chain: one step's latency on top of the base
        return (lat["base"] + lat["step_between_nodes"]) * 1e-6
    if algorithm == "tree":
        steps_in, steps_between = 2 * (ranks // nodes - 1), 2 * int(math.log2(nodes))
        return (lat["base"] + steps_in * lat["tree_step_in_node"] + steps_between * lat["step_between_nodes"]) * 1e-6
    twice = 2 if collective == "all_reduce" else 1
    steps, between = twice * (ranks - 1), twice * (nodes - 1)
    return (lat["base"] + (steps - between) * lat["ring_step_in_node"] + between * lat["step_between_nodes"]) * 1e-6


def across_nodes(inter: Link, intra: Link, ranks_per_node: int, nodes: int = 2, per_node: int = 8) -> Link:
    """The link a collective runs at when its group spans ``nodes`` nodes with ``ranks_per_node`` of its ranks on
    each, each with a NIC of its own (the products' rail-optimized nodes; ``per_node`` GPUs and NICs a node).

    Rings: NCCL builds a ring channel per NIC and each channel crosses between nodes through its own, so the group's
    bus bandwidth is ``ranks_per_node`` times the inter-node link's per-GPU figure, up to the intra-node link, which
    every rank's share of every channel crosses. NCCL's maintainers: "around 48GB/s from each CX7 NIC at 400Gbps ...
    aggregated to achieve up to ~396GB/s with the RING protocol" on NVLink nodes
    (https://github.com/NVIDIA/nccl-tests/issues/319; 46-48 GB/s per NDR NIC, issues/290), and "on an Nvidia
    DGX-A100 system we have 8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW"
    (https://github.com/NVIDIA/nccl/issues/812), 8 x 24. On a fabric measured at several node counts (``fabric``)
    the per-GPU figure is the measurement's share at these nodes (fabric_Bps / per_node).

    All-reduce trees (``tree_Bps``): on a measured fabric, one group reaches what the measurement over every GPU of
    these nodes reached, up to its own NICs (ranks_per_node x the share at the fewest nodes measured, where the
    NICs bind) and the intra-node link. Where that measurement lies far below the NICs' rate (the Ultra-Scale
    Playbook's: 64.9 GB/s over 32 nodes, 8 GB/s a NIC that carried 45 on 2), it is the fabric's rate for one
    group's collective, not the NICs': the data-parallel groups under tensor parallelism, T of them a node at once,
    each reach it (scalelab.forecast.published_sweep holds this to the sweep's runs).

    Rings on a measured fabric (a reduce-scatter, an all-gather, an all-reduce's ring) stay on the rails: the group's
    share of the measurement, not the tree's rate. The same sweep's fit set says so: its 1B tensor-parallel ZeRO-1
    runs, whose reduce-scatters and all-gathers are rings, follow the rails at 64-256 GPUs (within a few percent on
    average) and at the tree's rate would come out over a quarter too fast at 256 (tests/unit/test_published.py holds
    both). What one group's all-reduce reached is the tree's figure, not the fabric's for every algorithm. The held-out
    3B and 8B ZeRO-1 runs come out slower than published, the more the larger the model at the same ranks per node: a
    rate of the fabric, the same for every model, does not account for that (docs/prediction.md).

    On a measured fabric the result carries the group's shape (``span``) for NCCL's latency model
    (collective_seconds); a product or a number keeps its latency per call, an assumption to calibrate. A measured
    bench table (not ``per_nic``) is already the bus bandwidth its groups reached: returned as it is."""
    if ranks_per_node < 1 or int(ranks_per_node) != ranks_per_node:
        raise ValueError(f"a group spanning nodes holds a whole number >= 1 of ranks per node, got {ranks_per_node!r}")
    if not inter.per_nic or (ranks_per_node == 1 and not inter.fabric):
        return inter
    share = fabric_Bps(inter, nodes) / per_node if inter.fabric else inter.achievable_Bps
    rails = ranks_per_node * share
    tree, span = None, None
    if inter.fabric:  # measured with nccl-tests: NCCL's latency model, and the tree's rate measured
        nic = fabric_Bps(inter, inter.fabric[0][0]) / per_node
        tree, span = min(fabric_Bps(inter, nodes), ranks_per_node * nic, intra.achievable_Bps), (ranks_per_node, nodes)
    if ranks_per_node == 1:
        name, source = inter.name, inter.source
    elif rails <= intra.achievable_Bps:
        name, source = (f"{inter.name} x {ranks_per_node} rails",
                        f"{inter.source}; {ranks_per_node} ranks of the group per node, a NIC each (rails)")
    else:
        name, rails = f"{inter.name} x {ranks_per_node} rails (capped by {intra.name})", intra.achievable_Bps
        source = (f"{inter.source}; {ranks_per_node} NICs per node would carry {ranks_per_node * share / GB:.0f} GB/s, "
                  f"more than {intra.name} within the node ({intra.source})")
    if tree is not None and tree > rails:
        name += f", all-reduce tree {tree / GB:.3g} GB/s"
    return Link(name, rails, inter.latency_s, source, per_nic=False, span=span, tree_Bps=tree)


def fabric_Bps(link: Link, nodes: int) -> float:
    """The all-reduce bus bandwidth a measured fabric reached over every GPU of ``nodes`` nodes: the measurement there,
    else interpolated between the two nearest node counts measured (log-log), the nearest beyond the ends."""
    points = link.fabric
    if nodes <= points[0][0]:
        return points[0][1]
    for (n0, b0), (n1, b1) in zip(points, points[1:]):
        if nodes <= n1:
            w = math.log(nodes / n0) / math.log(n1 / n0)
            return math.exp((1 - w) * math.log(b0) + w * math.log(b1))
    return points[-1][1]


# ----------------------------------------------------------------------------- products
_GBIT = GB / 8  # 1 Gb/s in bytes/s


@dataclass(frozen=True)
class LinkProduct:
    """A link product of the table: its per-GPU unidirectional bandwidth and its source."""

    name: str
    bandwidth_Bps: float
    latency_s: float
    source: str
    note: str = ""
    """How the per-GPU unidirectional figure follows from the datasheet's (halved, per NIC, ...)."""
    aliases: tuple[str, ...] = ()
    per_nic: bool = False
    """The figure is one GPU's own NIC (Link.per_nic): a group spanning nodes runs on several (across_nodes)."""

    def link(self, efficiency: float = DEFAULT_EFFICIENCY) -> Link:
        return Link(self.name, self.bandwidth_Bps, self.latency_s,
                    f"{self.source}{'; ' + self.note if self.note else ''}", efficiency, per_nic=self.per_nic)


_BIDIRECTIONAL = "the datasheet's total is bidirectional: halved for one direction"
_PER_GPU_NIC = "one NIC per GPU (rail-optimized, e.g. DGX H100's 8 x ConnectX-7)"
_PCIE = ("per direction after 128b/130b encoding; GPU to GPU through a PCIe switch or the CPU "
         "reaches less")

PRODUCTS: tuple[LinkProduct, ...] = (
    # NVLink / NVSwitch, per GPU: the GPU datasheets' "NVLink" interconnect figure
    LinkProduct("nvlink-v100", 150 * GB, LATENCY_INTRA_S,
                "NVIDIA V100 Tensor Core GPU datasheet (SXM2): NVLink 300 GB/s",
                _BIDIRECTIONAL + "; NVLink 2 (DGX-2: NVSwitch; DGX-1's hybrid cube-mesh is not all-to-all)",
                ("nvlink2", "v100-nvlink")),
    LinkProduct("nvlink-a100", 300 * GB, LATENCY_INTRA_S,
                "NVIDIA A100 Tensor Core GPU datasheet (SXM): NVIDIA NVLink 600 GB/s",
                _BIDIRECTIONAL + "; NVLink 3 over NVSwitch (DGX/HGX A100)", ("nvlink3", "a100-nvlink")),
    LinkProduct("nvlink-h100", 450 * GB, LATENCY_INTRA_S,
                "NVIDIA H100 Tensor Core GPU datasheet (SXM): NVIDIA NVLink 900 GB/s",
                _BIDIRECTIONAL + "; NVLink 4 over NVSwitch (DGX/HGX H100, H200)",
                ("nvlink4", "h100-nvlink", "nvlink-h200", "h200-nvlink")),
    LinkProduct("nvlink-h100-nvl", 300 * GB, LATENCY_INTRA_S,
                "NVIDIA H100 Tensor Core GPU datasheet (H100 NVL): NVIDIA NVLink 600 GB/s",
                _BIDIRECTIONAL + "; an NVLink bridge joins pairs of boards only: other pairs talk over PCIe",
                ("h100-nvl-bridge",)),
    LinkProduct("nvlink-b200", 900 * GB, LATENCY_INTRA_S,
                "NVIDIA HGX B200 specifications: NVLink (5th generation) 1.8 TB/s per GPU",
                _BIDIRECTIONAL + "; NVLink 5 over NVSwitch", ("nvlink5", "b200-nvlink")),
    # InfiniBand, one NIC per GPU: 4x-port data rates of the HDR/NDR/XDR generations
    LinkProduct("ib-hdr", 200 * _GBIT, LATENCY_INTER_S,
                "NVIDIA ConnectX-6 InfiniBand adapter datasheet: HDR 200 Gb/s per port",
                _PER_GPU_NIC, ("hdr", "infiniband-hdr"), per_nic=True),
    LinkProduct("ib-ndr", 400 * _GBIT, LATENCY_INTER_S,
                "NVIDIA ConnectX-7 InfiniBand adapter datasheet: NDR 400 Gb/s per port",
                _PER_GPU_NIC, ("ndr", "infiniband-ndr"), per_nic=True),
    LinkProduct("ib-xdr", 800 * _GBIT, LATENCY_INTER_S,
                "NVIDIA ConnectX-8 SuperNIC datasheet / Quantum-X800 platform: XDR 800 Gb/s per port",
                _PER_GPU_NIC, ("xdr", "infiniband-xdr"), per_nic=True),
    # RoCE (RDMA over Converged Ethernet), one NIC per GPU: the Ethernet line rate
    LinkProduct("roce-100g", 100 * _GBIT, LATENCY_INTER_S,
                "IEEE 802.3ba (100 Gb/s Ethernet); e.g. NVIDIA ConnectX-6 Dx datasheet", _PER_GPU_NIC,
                ("roce-100", "100gbe"), per_nic=True),
    LinkProduct("roce-200g", 200 * _GBIT, LATENCY_INTER_S,
                "IEEE 802.3bs (200 Gb/s Ethernet); e.g. NVIDIA ConnectX-6 Dx datasheet", _PER_GPU_NIC,
                ("roce-200", "200gbe"), per_nic=True),
    LinkProduct("roce-400g", 400 * _GBIT, LATENCY_INTER_S,
                "IEEE 802.3bs (400 Gb/s Ethernet); e.g. NVIDIA ConnectX-7 datasheet", _PER_GPU_NIC,
                ("roce-400", "400gbe"), per_nic=True),
    # PCIe x16: 8 GT/s (3.0), 16 GT/s (4.0) and 32 GT/s (5.0) per lane, 128b/130b encoding
    LinkProduct("pcie3", 8 * 16 * (128 / 130) / 8 * GB, LATENCY_INTRA_S,
                "PCI-SIG PCI Express Base Specification 3.0: 8 GT/s per lane, x16", _PCIE,
                ("pcie3-x16", "pcie-gen3")),
    LinkProduct("pcie4", 16 * 16 * (128 / 130) / 8 * GB, LATENCY_INTRA_S,
                "PCI-SIG PCI Express Base Specification 4.0: 16 GT/s per lane, x16", _PCIE,
                ("pcie4-x16", "pcie-gen4")),
    LinkProduct("pcie5", 32 * 16 * (128 / 130) / 8 * GB, LATENCY_INTRA_S,
                "PCI-SIG PCI Express Base Specification 5.0: 32 GT/s per lane, x16", _PCIE,
                ("pcie5-x16", "pcie-gen5")),
)


def _key(name: str) -> str:
    return "-".join(name.replace("_", " ").replace("-", " ").split()).casefold()


_BY_NAME: dict[str, LinkProduct] = {}
for _product in PRODUCTS:
    for _name in (_product.name, *_product.aliases):
        if _BY_NAME.setdefault(_key(_name), _product) is not _product:
            raise AssertionError(f"{_name!r} names two link products")


def known_names() -> list[str]:
    """The products' names, in table order (aliases not listed)."""
    return [p.name for p in PRODUCTS]


def product(name: str) -> LinkProduct:
    """A link product by name or alias (case, spaces, hyphens and underscores ignored)."""
    found = _BY_NAME.get(_key(name))
    if found is None:
        raise ValueError(f"unknown link {name!r}; known: {', '.join(known_names())}, "
                         "or a bandwidth in GB/s per GPU, unidirectional (e.g. 50)")
    return found


def side_link(spec: str, per_node: int, between_nodes: bool, efficiency: float | None = None) -> Link:
    """A link as a user gives it for one side (within nodes, or between them): a measured ``busbw:GBPS/RANKS`` read
    over ``per_node`` GPUs on that side (measured_busbw), else a product or a bandwidth (parse_link). What
    ``estimate scaling --intra-node/--inter-node`` and ``planning.forecast.*`` both read."""
    if spec.strip().startswith("busbw:"):  # what nccl-tests printed, over its ranks
        return measured_busbw(spec, per_node, between_nodes)
    return parse_link(spec, efficiency, per_node)


def parse_link(spec: str, efficiency: float | None = None, per_node: int = 8) -> Link:
    """A link from a command-line spec: a measured ``busbw:GBPS/RANKS`` (measured_busbw: between nodes where RANKS spans
    more than ``per_node`` GPUs), a product name (PRODUCTS), or a number = GB/s per GPU,
    unidirectional, nominal (latency LATENCY_NUMBER_S); ``@E`` after either sets this link's
    efficiency (``46@1``: 46 GB/s achieved per NIC, as nccl-tests' busbw reads with one rank on each of two nodes).
    ``efficiency``: DEFAULT_EFFICIENCY when None. A bench table is not parsed here:
    scalelab.formulas.link_fit.fit_link reads those."""
    if spec.strip().startswith("busbw:"):  # within a node where every count is one node's GPUs or fewer
        ranks = [int(part.partition("/")[2] or 0) for part in spec.strip().removeprefix("busbw:").split(",")
                 if part.partition("/")[2].isdigit()]
        return measured_busbw(spec, per_node, between_nodes=bool(ranks) and min(ranks) > per_node)
    text, at, own = spec.strip().partition("@")
    if at:
        try:
            efficiency = float(own)
        except ValueError:
            raise ValueError(f"link {spec!r}: the efficiency after '@' must be a number in (0, 1]") from None
        if not (math.isfinite(efficiency) and 0 < efficiency <= 1):
            raise ValueError(f"link {spec!r}: the efficiency after '@' must be a number in (0, 1], got {own}")
    efficiency = DEFAULT_EFFICIENCY if efficiency is None else efficiency
    text = text.strip()
    try:
        gb_per_s = float(text)
    except ValueError:
        return product(text).link(efficiency)
    if not (math.isfinite(gb_per_s) and gb_per_s > 0):
        raise ValueError(f"link bandwidth {spec!r} must be a positive number of GB/s per GPU")
    return Link(f"{gb_per_s:g} GB/s", gb_per_s * GB, LATENCY_NUMBER_S,
                "given as a number: GB/s per GPU, unidirectional; latency assumed", efficiency, per_nic=True)


def measured_busbw(spec: str, per_node: int, between_nodes: bool) -> Link:
    """A link from what nccl-tests printed: ``busbw:GBPS/RANKS``, the all-reduce bus bandwidth (its "busbw" column, GB/s,
    at a large size) measured over RANKS ranks, every GPU of RANKS / per_node nodes (``mpirun -np RANKS
    all_reduce_perf``). Within a node (RANKS <= per_node) it is the intra-node link as measured. Between nodes it is
    the ring over every rank's own NIC: one NIC's share is GBPS / per_node, the per-GPU figure a group spanning nodes
    multiplies by its ranks on a node (across_nodes). Measured: efficiency 1, no factor to remember.

    Between nodes the form may be given at several counts, comma-separated (``busbw:361.7/16,64.9/256``): a fabric
    (Link.fabric). A group spanning N nodes then runs its rings on its share of the measurement at N nodes
    (interpolated between counts), and its all-reduce tree at the whole measurement there, up to its NICs, whose rate
    the fewest nodes measured give (across_nodes). One count: that figure at every count, as before."""
    points = [_one_busbw(spec, part, per_node, between_nodes) for part in spec.strip().removeprefix("busbw:").split(",")]
    if len(points) > 1 and not between_nodes:
        raise ValueError(f"link {spec!r}: within a node give one measurement, busbw:GBPS/RANKS")
    if len({n for n, _ in points}) < len(points):
        raise ValueError(f"link {spec!r}: each count of ranks once")
    points.sort()
    ranks, value = points[-1]
    per_gpu = value / per_node if between_nodes else value
    counts = ", ".join(f"{v:g} GB/s over {n}" for n, v in points)
    fabric = tuple((n // per_node, v * GB) for n, v in points) if between_nodes else ()
    name = (f"busbw {value:g} GB/s over {ranks} ranks" if len(points) == 1 else
            f"busbw measured on {points[0][0] // per_node}-{ranks // per_node} nodes")
    return Link(name, per_gpu * GB, LATENCY_NUMBER_S,
                f"measured: nccl-tests all-reduce busbw {counts} ranks"
                + (f", / {per_node} NICs per node (the per-GPU figure at the most nodes measured); a collective across "
                   "nodes pays NCCL's latency for its group's shape instead of the latency per call"
                   if between_nodes else ""), 1.0, per_nic=between_nodes, fabric=fabric)


def _one_busbw(spec: str, body: str, per_node: int, between_nodes: bool) -> tuple[int, float]:
    """(RANKS, GBPS) of one GBPS/RANKS of a busbw spec, checked."""
    gbps, slash, ranks = body.partition("/")
    try:
        value, n = float(gbps), int(ranks)
    except ValueError:
        raise ValueError(f"link {spec!r}: write busbw:GBPS/RANKS, e.g. busbw:64.9/256 (nccl-tests' all-reduce busbw "
                         "over 256 ranks)") from None
    if not (slash and math.isfinite(value) and value > 0 and n >= 2):
        raise ValueError(f"link {spec!r}: GBPS must be a positive number and RANKS a whole number >= 2")
    if between_nodes and (n <= per_node or n % per_node):
        raise ValueError(f"link {spec!r}: between nodes, RANKS must be every GPU of two nodes or more ({per_node} per node)")
    return n, value


DEFAULT_INTRA_NODE = {
    "A100 SXM 40GB": "nvlink-a100", "A100 SXM 80GB": "nvlink-a100",
    "H100 SXM": "nvlink-h100", "H200 SXM": "nvlink-h100", "B200": "nvlink-b200",
    "V100 SXM2 16GB": "nvlink-v100", "V100 SXM2 32GB": "nvlink-v100",
    "A100 PCIe 40GB": "pcie4", "A100 PCIe 80GB": "pcie4", "V100 PCIe 16GB": "pcie3", "V100 PCIe 32GB": "pcie3",
    "H100 PCIe": "pcie5", "L40S": "pcie4", "L4": "pcie4", "A10": "pcie4",
}
"""The link within a node a GPU product (scalelab.registries.hardware's display name) implies: the SXM parts'
NVLink over NVSwitch, the PCIe boards' slot generation (their datasheets' host interface). Not
listed (H100/H200 NVL: bridged pairs; GH200: one GPU per superchip): give --intra-node."""


# ----------------------------------------------------------------------------- a step's collectives
# What one optimizer step hands to collectives, sized and counted for collective_seconds: shared by
# scalelab.results.prediction (runs of a sweep) and `scalelab estimate scaling` (GPU counts not run).


def collective_sizes(n_params: int, step: RankStep, last_block_params: float = 0.0) -> dict[str, float]:
    """Bytes per optimizer step by collective of a rank running ``step``, as nccl-tests sizes them (module doc: the
    whole buffer; an all-reduce of S bytes is S here, 2S in communication's unit): communication.comm_bytes_by_type
    converted (the gradient term an all-reduce where gradients are replicated, a reduce-scatter where
    they are sharded; the parameter term an all-gather where parameters are sharded,
    ZeroRedundancyOptimizer's fp32 broadcast otherwise; fp16's loss-scaler flag)."""
    handed = communication.comm_bytes_by_type(n_params, step, last_block_params=last_block_params)
    return {c: b / handed_per_size(c) for c, b in handed.items()}


def _parameter_tensors(cfg: ModelConfig) -> int:
    """Parameter tensors of the family's model (scalelab.registries.families: GPT-2 12 per block + wte, wpe,
    ln_f (+ an untied head); llama 9 per block + wte, norm, head)."""
    return family(cfg.family).parameter_tensors(cfg)


def collective_calls(cfg: ModelConfig, zero_stage: int, precision: str, sizes: dict[str, float],
                     accumulation_steps: int = 1, bucket_mb: float | None = None, tensor_parallel: int = 1,
                     last_block_kept: bool = False) -> dict[str, int]:
    """Calls per optimizer step by collective, each paying the link's latency once: DDP one
    all-reduce per gradient bucket of ``bucket_mb`` MiB (default strategies.DDP_BUCKET_MB; a model split by tensor
    parallelism is replicated per unit by FSDP2's replicate instead: one all-reduce per unit); FSDP2 one all-gather per unit (every
    block, and the root) per gathering pass (last_block_kept: the last block's second gather not issued), one
    reduce-scatter per unit (and under hybrid sharding
    one all-reduce per unit across replicas); ZeroRedundancyOptimizer one broadcast per parameter
    tensor (issued together: their latencies overlap, so this counts them high); fp16's loss scaler
    one all-reduce of its flag."""
    from scalelab.registries.strategies import DDP_BUCKET_MB

    record, units = strategy(zero_stage), cfg.n_layers + 1
    scaler = 1 if PRECISIONS[precision].loss_scaling else 0
    calls = {}
    for collective, size in sizes.items():
        if collective == "all_reduce":
            grads = size - scaler * communication.LOSS_SCALER_COMM_BYTES / handed_per_size("all_reduce")
            if record.ddp_wraps(2, tensor_parallel):  # DDP's buckets (a data-parallel group: calls exist)
                cap = DDP_BUCKET_MB if bucket_mb is None else float(bucket_mb)
                calls[collective] = math.ceil(grads / (cap * 2 ** 20)) + scaler
            else:  # hybrid sharding all-reduces each unit's gradient shard across replicas; replicate each unit's gradients
                calls[collective] = (units if grads > 0 else 0) + scaler
        elif collective == "all_gather":  # less the last block's second gather per micro-batch, where it is kept
            kept = accumulation_steps if last_block_kept and record.last_block_kept else 0
            calls[collective] = math.ceil(record.param_psi(accumulation_steps)) * units - kept
        elif collective == "reduce_scatter":
            calls[collective] = units
        else:
            calls[collective] = _parameter_tensors(cfg)
    return calls
