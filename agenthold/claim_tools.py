"""The standard tool set: register, claim, release, status and wait, over claims.Coordinator,
with the wording agents read (descriptions, replies, hints) and the server's instructions.

Decisions behind it:
- A wait holds no thread: it looks at the resource in a short read, then sleeps on the change
  feed (``App.wait_for``) until the resource, or its holder's lease, changes.
- A call that names an agent tells the application which connection named it, so that the
  agent's lease can end with the connection (see ``server.AgentTracker``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from agenthold.claim_types import (
    MAX_AGENT_NAME,
    MAX_MODEL,
    MAX_PURPOSE,
    ClaimResult,
    Holder,
    Previous,
    Registration,
    ReleaseResult,
    StatusResult,
    WaitResult,
)
from agenthold.claims import Coordinator, waited
from agenthold.principals import require_claim
from agenthold.store import utc_iso
from agenthold.toolkit import WAIT_TIMEOUT, App, Param, Reply, ToolCall, ToolSpec
from agenthold.uris import Resource

HINTS: dict[str, str] = {
    "modified": "The previous holder modified this resource: read it again before you change it.",
    "created": "The previous holder created this resource: read it before you change it.",
    "deleted": (
        "The previous holder deleted this resource: check whether it exists before you act on it."
    ),
    "moved": (
        "The previous holder moved this resource to {moved_to}: work on the new location "
        "(claim it) instead."
    ),
    "abandoned": (
        "The previous holder disconnected while holding this resource and did not come back: "
        "its work may be unfinished, so check the resource before you rely on it."
    ),
    "expired": (
        "The previous holder's claim expired (it made no call within the claim TTL): its work "
        "may be unfinished, so check the resource before you rely on it."
    ),
}
BUSY_HINT = (
    "Another agent holds this resource. Work on a different resource, or call agenthold_wait "
    "to be told when it is released, then claim it again."
)
TIMEOUT_HINT = (
    "The resource was not released within the timeout. Work on something else, or call "
    "agenthold_wait again with a longer timeout."
)
NOT_FOUND_HINT = "No agent ever claimed this resource, so there is nothing to release."
NOT_CLAIMED_HINT = "The resource is not claimed; there is nothing to release."
LAPSED_HINT = (
    "Your claim ended ({outcome}) at {at} before this release; claim the resource again before "
    "you change it."
)

RESOURCE = Param(
    "resource",
    "string",
    "the file or resource: a path relative to the workspace (src/main.py), an absolute path "
    "inside a workspace, file://<workspace>/<path>, or custom://<name> for anything that is "
    "not a file",
)
AGENT_ID = Param("agent_id", "string", "your agent_id, from agenthold_register")

STANDARD_NAMES = frozenset(
    {"agenthold_register", "agenthold_claim", "agenthold_release", "agenthold_status",
     "agenthold_wait"}
)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Replies: what an agent reads of a Coordinator's result
# --------------------------------------------------------------------------------------------


def previous_fields(previous: Previous | None) -> Reply:
    """The fields that tell a new holder (or a waiter) what the last holder left."""
    if previous is None:
        return {}
    fields: Reply = {
        "previous_outcome": previous.outcome,
        "previous_holder": previous.holder,
        "previous_outcome_at": previous.at,
    }
    if previous.outcome == "moved":
        fields["moved_to"] = previous.moved_to
    fields["hint"] = HINTS[previous.outcome].format(moved_to=previous.moved_to)
    return fields


def _held_as(reply: Reply, holder: Holder) -> Reply:
    if holder.held_as is not None:
        reply["held_as"] = holder.held_as
    return reply


def reply(result: Any) -> Reply:
    """The tool reply of a Coordinator result (register, claim, release, status or wait)."""
    if isinstance(result, ClaimResult):
        if result.status == "busy":
            h = result.holder
            assert h is not None
            busy = {"status": "busy", "resource": result.resource, "held_by": h.agent_id,
                    "agent_name": h.name, "claimed_at": h.claimed_at,
                    "hint": BUSY_HINT}  # fmt: skip
            return _held_as(busy, h)
        return {"status": result.status, "resource": result.resource, "version": result.version,
                **previous_fields(result.previous)}  # fmt: skip
    if isinstance(result, ReleaseResult):
        out: Reply = {"status": result.status, "resource": result.resource}
        if result.status == "not_found":
            out["hint"] = NOT_FOUND_HINT
        elif result.status == "already_free":
            out["version"] = result.version
            ended = result.ended
            out["hint"] = (
                NOT_CLAIMED_HINT
                if ended is None
                else LAPSED_HINT.format(outcome=ended.outcome, at=ended.at)
            )
        else:
            out.update(version=result.version, outcome=result.outcome)
            if result.moved_to:
                out["moved_to"] = result.moved_to
        return out
    if isinstance(result, StatusResult):
        if result.holder is None:
            return {"status": "available", "resource": result.resource,
                    **previous_fields(result.previous)}  # fmt: skip
        h = result.holder
        held = {"status": "claimed", "resource": result.resource, "held_by": h.agent_id,
                "agent_name": h.name, "agent_model": h.model, "claimed_at": h.claimed_at,
                "version": result.version}  # fmt: skip
        _held_as(held, h)
        if h.lease_ends_at is not None:
            held["lease_ends_at"] = utc_iso(h.lease_ends_at)
        return held
    if isinstance(result, WaitResult):
        if result.holder is None:
            return {"status": "available", "resource": result.resource,
                    **previous_fields(result.previous),
                    "elapsed_seconds": result.elapsed_seconds}  # fmt: skip
        h = result.holder
        return {"status": "timeout", "resource": result.resource, "held_by": h.agent_id,
                "agent_name": h.name, "elapsed_seconds": result.elapsed_seconds,
                "hint": TIMEOUT_HINT}  # fmt: skip
    if isinstance(result, Registration):
        registered: Reply = {"status": "registered", "agent_id": result.agent_id,
                             "name": result.name,
                             "registered_at": result.registered_at}  # fmt: skip
        if result.model:
            registered["model"] = result.model
        return registered
    raise TypeError(f"not a Coordinator result: {type(result).__name__}")


class ClaimHandlers:
    """The handlers of the standard tools, over one application."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.coordinator = app.coordinator

    async def register(self, call: ToolCall) -> Reply:
        a = call.args
        done: Registration = await self.app.write(
            lambda: self.coordinator.register(
                a["name"], a["model"], a["purpose"], principal=call.by
            )
        )
        self.app.note_agent(call.connection, done.agent_id, registered=True)
        return reply(done)

    async def claim(self, call: ToolCall) -> Reply:
        a = call.args
        resource = a["resource"]
        if call.principal is not None:  # resolved once here, for the scope check and the claim
            resource = self.coordinator.resolver.resolve(resource)
            require_claim(call.principal, resource.uri, resource.workspace)
        done = await self.app.write(
            lambda: self.coordinator.claim(resource, a["agent_id"], principal=call.by)
        )
        self.app.note_agent(call.connection, a["agent_id"])
        return reply(done)

    async def release(self, call: ToolCall) -> Reply:
        a = call.args
        done = await self.app.write(
            lambda: self.coordinator.release(
                a["resource"], a["agent_id"], a["outcome"], a["moved_to"], principal=call.by
            )
        )
        self.app.note_agent(call.connection, a["agent_id"])
        return reply(done)

    async def status(self, call: ToolCall) -> Reply:
        return reply(await self.app.read(self.coordinator.status, call.args["resource"]))

    async def wait(self, call: ToolCall) -> Reply:
        resource: Resource = self.coordinator.resolver.resolve(call.args["resource"])
        timeout = call.args["timeout_seconds"]
        start = time.monotonic()
        coordinator = self.coordinator

        async def look() -> tuple[Reply | None, Iterable[tuple[str, ...]], float | None]:
            probe = await self.app.read(coordinator.probe, resource)
            if probe.available:
                return reply(waited(resource, probe, time.monotonic() - start)), probe.topics, None
            return None, probe.topics, probe.lease_ends_at

        async def give_up() -> Reply:
            probe = await self.app.read(coordinator.probe, resource)
            return reply(waited(resource, probe, time.monotonic() - start))

        progress = call.progress(timeout, f"{resource.uri} to be released")
        return await self.app.wait_for(look, give_up, timeout, progress)


def standard_tools(app: App) -> list[ToolSpec]:
    a = ClaimHandlers(app)
    return [
        ToolSpec(
            "agenthold_register",
            "Register as an agent",
            "Register yourself and get an agent_id. Call this once, before your first claim, "
            "and pass the agent_id to agenthold_claim and agenthold_release from then on. The "
            "id keeps working across reconnects and restarts; register again only if a call "
            "says the agent_id is unknown.",
            (
                Param(
                    "name",
                    "string",
                    "a short name for yourself, e.g. editor or reviewer",
                    max_length=MAX_AGENT_NAME,
                ),
                Param(
                    "model",
                    "string",
                    "the model you run on, if known",
                    False,
                    "",
                    max_length=MAX_MODEL,
                ),
                Param(
                    "purpose",
                    "string",
                    "what you are working on, in a few words",
                    False,
                    "",
                    max_length=MAX_PURPOSE,
                ),
            ),
            read_only=False,
            destructive=False,
            idempotent=False,
            handler=a.register,
        ),
        ToolSpec(
            "agenthold_claim",
            "Claim a file or resource",
            "Claim a file or other shared resource BEFORE you modify, create, delete or move "
            "it, so no other agent changes it at the same time. Reading needs no claim. "
            "Replies: 'claimed' (it is yours until you release it; if previous_outcome is "
            "present, follow the hint: the last holder modified, created, deleted or moved it, "
            "or left without finishing), 'already_claimed' (you hold it already), or 'busy' "
            "(another agent holds it: do not touch it; work on something else, or call "
            "agenthold_wait and then claim again). To rename a file, claim both the old and "
            "the new path first.",
            (RESOURCE, AGENT_ID),
            read_only=False,
            destructive=False,
            idempotent=True,
            handler=a.claim,
        ),
        ToolSpec(
            "agenthold_release",
            "Release a claim, saying what you did",
            "Release a resource you claimed as soon as you are done, and say honestly what "
            "you did: 'modified' (changed it in place), 'created' (it did not exist before), "
            "'deleted' (it no longer exists), 'moved' (it now lives elsewhere; give the new "
            "location in moved_to), or 'released' (you did not change it). The next agent to "
            "claim it is told. To rename old to new: claim both, rename, then release old with "
            "outcome 'moved' and moved_to the new path, and release new with outcome 'created'.",
            (
                RESOURCE,
                AGENT_ID,
                Param(
                    "outcome",
                    "string",
                    "what you did to the resource",
                    False,
                    "released",
                    enum=("released", "modified", "created", "deleted", "moved"),
                ),
                Param(
                    "moved_to",
                    "string",
                    "the new path or URI, only with outcome 'moved'",
                    required=False,
                ),
            ),
            read_only=False,
            destructive=False,
            idempotent=False,
            handler=a.release,
        ),
        ToolSpec(
            "agenthold_status",
            "Check a resource",
            "See whether a resource is claimed, without claiming it and without registering. "
            "Replies 'claimed' (held_by, agent_name, claimed_at) or 'available' (with "
            "previous_outcome and a hint when the last holder changed, moved or deleted it, "
            "or left without finishing).",
            (RESOURCE,),
            read_only=True,
            destructive=False,
            idempotent=True,
            handler=a.status,
        ),
        ToolSpec(
            "agenthold_wait",
            "Wait for a resource to be released",
            "Wait until a claimed resource is released, then claim it with agenthold_claim "
            "(waiting does not claim it for you). Replies 'available' the moment the holder "
            "releases it or its claim ends, with previous_outcome when there is something to "
            "know (read the resource again if it was modified; use moved_to if it moved), or "
            "'timeout' when timeout_seconds pass first. Your turn is blocked while you wait: "
            "wait only when you have nothing else to do.",
            (RESOURCE, WAIT_TIMEOUT),
            read_only=True,
            destructive=False,
            idempotent=True,
            handler=a.wait,
        ),
    ]


def instructions(coordinator: Coordinator) -> str:
    """What a standard-mode server tells every client: the protocol and the workspaces."""
    lines = [
        "agenthold keeps agents that work on the same files from overwriting each other.",
        "1. Call agenthold_register once, at the start, and keep the agent_id it returns.",
        "2. Before you modify, create, delete or move a file or shared resource, call "
        "agenthold_claim. 'busy' means another agent is working on it: leave it alone, work on "
        "something else or call agenthold_wait, then claim it again.",
        "3. As soon as you are done, call agenthold_release with what you did: modified, "
        "created, deleted, moved (with moved_to) or released (no change).",
        "4. To rename a file: claim the old and the new path, rename, then release the old "
        "path as moved (moved_to the new path) and the new path as created.",
        "Reading needs no claim. Paths are relative to a workspace:",
    ]
    for ws in coordinator.resolver.workspaces:
        lines.append(f"- {ws.name}: {ws.root}")
    lines.append(
        "Name files in another workspace as file://<workspace>/<path>, and shared things that "
        "are not files as custom://<name>."
    )
    return "\n".join(lines)
