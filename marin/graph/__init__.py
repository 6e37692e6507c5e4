"""The DAG: collection and checks before anything runs, and the plan with its explanations."""

from marin.graph.dag import Graph, Node, build_graph
from marin.graph.plan import Plan, PlanEntry, make_plan

__all__ = ["Graph", "Node", "Plan", "PlanEntry", "build_graph", "make_plan"]
