"""agenthold 0.10's ``agenthold.coordinator``, kept importable: claims live in
:mod:`agenthold.claims`, whose :class:`~agenthold.claims.Coordinator` still takes the store and a
registry of workspaces (an :class:`agenthold.resources.WorkspaceRegistry` or any
:class:`~agenthold.claims.names.Resolver`) as 0.10's did. Its results are typed, not dicts
(docs/upgrading.md)."""

from __future__ import annotations

from agenthold.claims.coordinator import LAPSE_OUTCOMES, OUTCOMES, Coordinator
from agenthold.resources import parse_resource_input  # reachable here in 0.10 too

__all__ = ["AGENT_OUTCOMES", "ALL_OUTCOMES", "Coordinator", "parse_resource_input"]

AGENT_OUTCOMES: frozenset[str] = frozenset(OUTCOMES)
"""The outcomes an agent may give on release (0.10's name; 0.11's is ``claims.OUTCOMES``)."""
ALL_OUTCOMES: frozenset[str] = AGENT_OUTCOMES | frozenset(LAPSE_OUTCOMES)
"""Those and the two an ended lease gives, ``expired`` and ``abandoned``."""
