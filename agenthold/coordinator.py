"""agenthold 0.10's ``agenthold.coordinator``, kept importable: claims live in
:mod:`agenthold.claims`, whose :class:`~agenthold.claims.Coordinator` still takes the store and a
registry of workspaces (an :class:`agenthold.resources.WorkspaceRegistry` or any
:class:`~agenthold.uris.Resolver`) as 0.10's did. Its results are typed, not dicts
(docs/upgrading.md)."""

from __future__ import annotations

from agenthold.claims import Coordinator

__all__ = ["Coordinator"]
