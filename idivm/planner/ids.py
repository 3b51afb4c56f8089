"""Pass 1: infer the IDs of every operator (Table 1), extending projections with missing IDs."""

from __future__ import annotations

from idivm import algebra as A
from idivm.catalog import Catalog
from idivm.planner.model import NodeInfo
from idivm.rules import rule_for


def infer_ids(root: A.Node, catalog: Catalog) -> tuple[A.Node, dict[int, NodeInfo]]:
    """A post-order traversal applying each operator's ID-inference rule.

    Returns the (possibly extended) plan and the annotations of every operator by ``nid``.
    """
    infos: dict[int, NodeInfo] = {}

    def go(node: A.Node) -> A.Node:
        for i, child in enumerate(node.children):
            new = go(child)
            if new is not child:
                node = A.replace_child(node, i, new)
        node, info = rule_for(node).infer(node, [infos[c.nid] for c in node.children], catalog)
        infos[node.nid] = info
        return node

    return go(root), infos
