"""Which link a collective's bytes travel: within one node or across nodes, and
which node each rank sits on under torchrun's contiguous placement."""

LINKS = ("intra_node", "inter_node")
"""Where a collective's bytes travel: within one node, or across nodes."""


def link_of(group_ranks, node_of) -> str:
    """The link of a collective over ``group_ranks`` (global ranks): ``inter_node`` when they sit
    on more than one node, else ``intra_node``. ``node_of[r]`` names rank r's node (its hostname,
    or its index: rank r // ranks per node under torchrun's contiguous placement).

    The convention: every byte a rank hands to a collective whose group spans nodes counts as
    inter-node, although a ring or a hierarchical algorithm sends part of it between ranks of one
    node; a collective within a node counts wholly intra-node. It is what decides whether the
    collective runs between nodes (at the inter-node link's rate, over as many NICs as the group has ranks
    on each node: scalelab.formulas.links.across_nodes)."""
    nodes = {node_of[r] for r in group_ranks}
    if not nodes:
        raise ValueError("a collective's group has no ranks")
    return LINKS[len(nodes) > 1]


def contiguous_nodes(world_size: int, ranks_per_node: int) -> list[int]:
    """Each rank's node index under torchrun's placement (ranks 0..P-1 on the first node, ...);
    ValueError naming the culprit for a count below 1."""
    if world_size < 1 or ranks_per_node < 1:
        raise ValueError(f"world_size and ranks_per_node must be >= 1, got {world_size} and {ranks_per_node}")
    return [r // ranks_per_node for r in range(world_size)]
