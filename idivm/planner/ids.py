"""Pass 1: infer the IDs of every operator (Table 1), extending projections with missing IDs."""

from __future__ import annotations

import dataclasses

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
        rule = rule_for(node)
        node, info = rule.infer(node, [infos[c.nid] for c in node.children], catalog)
        if not rule.keeps_output:  # an aggregate's Output below is cached, not read through
            below = [infos[c.nid].output_carry for c in node.children]
            own = () if info.output_carry in below else info.output_carry  # (a γ's own)
            keep = set(own) | set(info.ids)
            inherited = {x for b in below for x in b}
            info = dataclasses.replace(
                info, carry=tuple(x for x in info.carry if x not in inherited or x in keep),
                output_carry=own)
        infos[node.nid] = info
        return node

    return go(root), infos
