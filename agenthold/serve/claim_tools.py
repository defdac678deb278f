"""The standard tool set: register, claim, release, status and wait, over claims.Coordinator,
with the wording agents read (descriptions, replies, hints) and the server's instructions.

Decisions behind it:
- A wait holds no thread: it looks at the resource in a short read, then sleeps on the change
  feed (``App.wait_for``) until the resource, or its holder's lease, changes.
- A call that names an agent tells the application which connection named it, so that the
  agent's lease can end with the connection (see ``server.AgentTracker``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from typing import Any

import anyio
import anyio.lowlevel

from agenthold.claims.coordinator import MAX_SET, Coordinator, waited
from agenthold.claims.names import Resource
from agenthold.claims.patterns import Pattern
from agenthold.claims.records import (
    MAX_AGENT_NAME,
    MAX_MODEL,
    MAX_PURPOSE,
    OUTCOMES,
    ClaimResult,
    ClaimSetResult,
    ForeignAgentError,
    Holder,
    NotHolderError,
    Previous,
    QueueLook,
    Registration,
    ReleaseResult,
    ReleaseSetResult,
    StatusResult,
    Unheard,
    UnknownAgentError,
    WaitResult,
    check_mode,
    claim_waited,
)
from agenthold.identity.principals import ForbiddenError, require_claim
from agenthold.serve.toolkit import (
    PAGE_BYTES,
    WAIT_TIMEOUT,
    App,
    Param,
    Reply,
    ToolCall,
    ToolError,
    ToolSpec,
    fit_page,
    short,
)
from agenthold.store import AgentholdError, InvalidInputError, utc_iso

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
# What an agent is told to do about a library error, in tool names (the library's own hints
# name its methods); the server uses these for calls of this set's tools.
ERROR_HINTS: dict[type[Exception], str] = {
    UnknownAgentError: "Call agenthold_register to get an agent_id, then use it in every call.",
    ForeignAgentError: (
        "Use an agent_id that agenthold_register gave you, with the same token; register to "
        "get one."
    ),
    NotHolderError: (
        "Only the holder can release a claim. Call agenthold_status to see who holds it."
    ),
}
BUSY_HINT = (
    "Another agent holds this resource. Work on a different resource, or call agenthold_wait "
    "to be told when it is released, then claim it again."
)
# Not "a longer timeout": a host that shows no progress may cut a call after a minute, so the
# README advises waits of 45 s or less, called again.
TIMEOUT_HINT = (
    "The resource was still held when the timeout ran out. Work on something else, or call "
    "agenthold_wait again to keep waiting (short waits, repeated, are safer than one long one)."
)
BUSY_SET_HINT = (
    "Nothing was claimed: the resources marked busy are held. Claim a set that leaves them out, "
    "or call agenthold_wait for each busy one, then claim the set again."
)
MAX_CONFLICTS_SHOWN = 10
NOT_FOUND_HINT = "No agent ever claimed this resource, so there is nothing to release."
NOT_CLAIMED_HINT = "The resource is not claimed; there is nothing to release."
LAPSED_HINT = (
    "Your claim ended ({outcome}) at {at} before this release; claim the resource again before "
    "you change it."
)

RESOURCE_ONE = Param(
    "resource",
    "string",
    "a workspace path (src/main.py), file://<workspace>/<path> or custom://<name>",
)
RESOURCE = Param(RESOURCE_ONE.name, "string", RESOURCE_ONE.description, required=False)
RESOURCES = Param("resources", "array", "instead of resource: a list of them", required=False)
AGENT_ID = Param("agent_id", "string", "your agent_id, from agenthold_register")
MODE = Param(
    "mode",
    "string",
    "shared: to read, with others",
    required=False,
    default="exclusive",
    enum=("exclusive", "shared"),
)

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
    if previous.outcome in HINTS:  # a hand-off tells a plain release too, which needs no hint
        fields["hint"] = HINTS[previous.outcome].format(moved_to=previous.moved_to)
    return fields


def _item(one: Reply) -> Reply:
    """One resource's part of a set's reply: the set's hint says what to do when it is busy."""
    if one["status"] == "busy":
        del one["hint"]
    return one


def statuses(results: tuple[StatusResult, ...]) -> Reply:
    """The reply of a status of several resources: "claimed" if any one in it is. Cut to a
    page of PAGE_BYTES (a hundred claimed resources with long names can be more), it says how
    many of the resources asked for it answers (the first ones, in order), to ask on for the
    others."""

    def finish(page: Reply, kept: int) -> Reply:
        held = any(r.status == "claimed" for r in results[:kept])
        page["status"] = "claimed" if held else "available"
        if kept < len(results):
            page["answered"] = kept
            page["unanswered_count"] = len(results) - kept
            page["hint"] = (
                f"Only the first {kept} of the resources asked for are here, to keep this reply "
                f"under {PAGE_BYTES:,} bytes: call agenthold_status again with the resources "
                f"after the first {kept}."
            )
        return page

    page: Reply = {"status": "", "resources": [reply(r) for r in results]}
    return fit_page(page, "resources", PAGE_BYTES, finish)


def _held_as(reply: Reply, holder: Holder) -> Reply:
    if holder.held_as is not None:
        reply["held_as"] = holder.held_as
    if holder.mode == "shared":
        reply["mode"] = "shared"
    return reply


def _busy_fields(busy: Reply, result: ClaimResult) -> None:
    """What a busy reply adds when several claims, readers or queued waits stand in the way."""
    held = [c for c in result.conflicts if not c.queued]
    if len(held) > 1:  # a directory or glob in the way of several claims, or several readers
        busy["conflicts"] = [
            _held_as({"resource": c.held_as or result.resource, "held_by": c.agent_id}, c)
            for c in held[:MAX_CONFLICTS_SHOWN]
        ]
        for c in busy["conflicts"]:
            c.pop("held_as", None)
    queued = [c.agent_id for c in result.conflicts if c.queued]
    if queued:  # waits in line ahead, which a claim may not jump
        busy["queued"] = queued[:MAX_CONFLICTS_SHOWN]


def reply(result: Any) -> Reply:
    """The tool reply of a Coordinator result (register, claim, release, status or wait)."""
    if isinstance(result, ClaimSetResult):
        items = [_item(reply(r)) for r in result.results]
        if result.status == "busy":
            return {"status": "busy", "resources": items, "hint": BUSY_SET_HINT}
        return {"status": "claimed", "resources": items}
    if isinstance(result, ReleaseSetResult):
        return {"status": result.status, "resources": [reply(r) for r in result.results]}
    if isinstance(result, ClaimResult):
        if result.status == "available":
            return {"status": "available", "resource": result.resource}
        if result.status == "busy":
            h = result.holder
            assert h is not None
            busy: Reply = {"status": "busy", "resource": result.resource, "held_by": h.agent_id,
                    "agent_name": h.name, "claimed_at": h.claimed_at,
                    "hint": BUSY_HINT}  # fmt: skip
            _held_as(busy, h)
            _busy_fields(busy, result)
            return busy
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
        held: Reply = {"status": "claimed", "resource": result.resource, "held_by": h.agent_id,
                "agent_name": h.name, "agent_model": h.model, "claimed_at": h.claimed_at,
                "version": result.version, "mode": result.mode}  # fmt: skip
        if not h.model:  # as register leaves out a model that was not given
            del held["agent_model"]
        _held_as(held, h)
        if result.holders:  # every reader of a shared claim
            held["holders"] = [
                {"held_by": r.agent_id, "agent_name": r.name, "claimed_at": r.claimed_at}
                for r in result.holders
            ]
        if h.lease_ends_at is not None:
            held["lease_ends_at"] = utc_iso(h.lease_ends_at)
        return held
    if isinstance(result, WaitResult):
        if result.status in ("claimed", "already_claimed"):  # handed over by the queue
            return {"status": result.status, "resource": result.resource,
                    "version": result.version, **previous_fields(result.previous),
                    "elapsed_seconds": result.elapsed_seconds}  # fmt: skip
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
        if result.purpose:
            registered["purpose"] = result.purpose
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
                a["name"], a["model"], a["purpose"], principal=call.by, host=self.app.host
            )
        )
        self.app.note_agent(call.connection, done.agent_id, registered=True)
        return reply(done)

    async def claim(self, call: ToolCall) -> Reply:
        a = call.args
        named = one_or_many("agenthold_claim", a, strings=True)
        wanted: list[Any] = list(named)
        if call.principal is not None:  # resolved once here, for the scope check and the claim
            wanted = [self.coordinator.target(r) for r in named]
            for found in wanted:
                await self._require_scope(call, found)
        done = await self.app.write(
            lambda: self.coordinator.claim_many(
                wanted, a["agent_id"], mode=a["mode"], principal=call.by
            )
        )
        self.app.note_agent(call.connection, a["agent_id"])
        return reply(done if a["resources"] is not None else done.results[0])

    async def _require_scope(self, call: ToolCall, target: Resource | Pattern) -> None:
        """ForbiddenError unless the caller's claim scopes allow ``target`` under every name it
        has: a hard link inside the scopes to a file outside them would let a claim block the
        file for everyone. Other names are looked for only when scopes limit claims and the
        file has several links; when they cannot all be found, the claim is refused."""
        require_claim(call.principal, target.uri, target.workspace)
        assert call.principal is not None
        if not isinstance(target, Resource) or target.file_id is None:
            return
        if call.principal.scopes.claim is None:
            return
        resolver = self.coordinator.resolver
        names = await self.app.read(resolver.names_of, target)
        if names is None:
            raise ForbiddenError(
                f"claim:{target.uri}",
                f"{target.uri} is a file with several names (hard links), and not all of them "
                "could be found inside the workspaces to check against its scopes",
            )
        for path in names[1:]:
            try:
                other = resolver.resolve(path, follow_links=False)
            except InvalidInputError:  # pragma: no cover - names_of looks inside workspaces
                other = None
            if other is None or not call.principal.scopes.may_claim(other.uri, other.workspace):
                shown = path if other is None else other.uri
                raise ForbiddenError(
                    f"claim:{shown}",
                    f"{target.uri} is another name (a hard link) of {shown}, which it may "
                    "not claim",
                )

    async def release(self, call: ToolCall) -> Reply:
        a = call.args
        if a["resources"] is None:
            items: list[tuple[str, str, str | None]] = [
                (one_or_many("agenthold_release", a, strings=True)[0], a["outcome"], a["moved_to"])
            ]
        else:
            if a["outcome"] != "released" or a["moved_to"] is not None:
                raise ToolError(
                    "with resources, give each one's outcome and moved_to inside its object",
                    'Pass resources as [{"resource": ..., "outcome": ..., "moved_to": ...}].',
                )
            items = [_release_item(x) for x in one_or_many("agenthold_release", a, strings=False)]
        done = await self.app.write(
            lambda: self.coordinator.release_many(items, a["agent_id"], principal=call.by)
        )
        self.app.note_agent(call.connection, a["agent_id"])
        return reply(done if a["resources"] is not None else done.results[0])

    async def status(self, call: ToolCall) -> Reply:
        a = call.args
        named = one_or_many("agenthold_status", a, strings=True)
        if a["resources"] is None:
            return reply(await self.app.read(self.coordinator.status, named[0]))
        return statuses(await self.app.read(self.coordinator.status_many, named))

    async def wait(self, call: ToolCall) -> Reply:
        a = call.args
        if not a["claim"] and (a["agent_id"] is not None or a["mode"] is not None):
            raise ToolError(
                "agent_id and mode are for a wait that claims: add claim true",
                "Call agenthold_wait again with claim: true to be handed the claim, or "
                "without agent_id and mode to be told when it is free.",
            )
        if a["claim"] and a["agent_id"] is None:
            raise ToolError(
                "claim: true needs agent_id: the agent the claim is handed to",
                "Call agenthold_wait again with your agent_id from agenthold_register.",
            )
        resource = self.coordinator.target(a["resource"])
        if a["claim"]:
            if call.principal is not None:
                await self._require_scope(call, resource)
            return await self._wait_to_claim(call, resource)
        timeout = a["timeout_seconds"]
        start = time.monotonic()
        coordinator = self.coordinator

        async def look() -> tuple[Reply | None, Iterable[tuple[str, ...]], float | None]:
            probe = await self.app.read(coordinator.probe, resource)
            if probe.unheard:  # a claim handed to a dead waiter is in the way: it goes back
                await self.app.write(coordinator.serve_queue)
                probe = await self.app.read(coordinator.probe, resource)
            if probe.available:
                return reply(waited(resource, probe, time.monotonic() - start)), probe.topics, None
            return None, probe.topics, probe.lease_ends_at

        async def give_up() -> Reply:
            probe = await self.app.read(coordinator.probe, resource)
            return reply(waited(resource, probe, time.monotonic() - start))

        progress = call.progress(timeout, f"{resource.uri} to be released")
        return await self.app.wait_for(look, give_up, timeout, progress)

    async def _wait_to_claim(self, call: ToolCall, resource: Resource | Pattern) -> Reply:
        """A wait in the resource's queue: each look is one write (coordinator.queue_look) that
        serves the queue; a wait that ends unanswered (timeout, cancel, closed connection)
        leaves it, and gives back a claim it was handed but could not tell its caller of."""
        a, coordinator = call.args, self.coordinator
        agent_id, mode, timeout = a["agent_id"], a["mode"] or "exclusive", a["timeout_seconds"]
        check_mode(mode)
        start = time.monotonic()
        seq: int | None = None
        seen: ClaimResult | None = None  # a claim a write read for this wait

        # These run in the write thread and note what they read there: a call cancelled while
        # its write runs gets no value from the await, but the write has happened.
        def look_once(left: float) -> QueueLook:
            nonlocal seq, seen
            step = coordinator.queue_look(resource, agent_id, mode, seq, left, principal=call.by)
            seq, seen = step.seq, step.result
            return step

        parked = False  # timed out and left its place kept: nothing to give back

        def leave_once(place: int) -> ClaimResult | None:
            nonlocal seen, parked
            got = coordinator.leave_queue(place)
            seen, parked = got or seen, got is None
            return got

        def still_live() -> None:
            live = coordinator.principal_live
            if call.by is not None and live is not None and not live(call.by):
                # its token was revoked while it waited: it leaves the queue (finally, below),
                # and a claim handed to it goes back
                raise ToolError(
                    f"the token of {call.by} was revoked while this wait was in line",
                    "Ask for a new token; this wait left the queue and holds no claim.",
                    kind="forbidden",
                )

        async def look() -> tuple[Reply | None, Iterable[tuple[str, ...]], float | None]:
            still_live()
            first = seq is None
            step = await self.app.write(look_once, max(0.0, timeout - (time.monotonic() - start)))
            if first:  # the first look passed the owner check: only now is the agent this
                # connection's (noted earlier, a refused intruder's session would end the
                # owner's lease when it closed)
                self.app.note_agent(call.connection, agent_id)
            if step.result is not None:
                # Asked again: the token may have been revoked while the write ran, and a
                # release made meanwhile by a server that knows no tokens handed this wait the
                # claim. Refused now, the claim goes back (finally, below).
                still_live()
                return reply(claim_waited(step.result, time.monotonic() - start)), (), None
            if not step.in_line:
                return await give_up(), (), None
            return None, step.topics, step.wake_at

        async def give_up() -> Reply:
            if seq is not None:
                got = await self.app.write(leave_once, seq)
                if got is not None:  # handed over just before the deadline
                    still_live()
                    return reply(claim_waited(got, time.monotonic() - start))
            probe = await self.app.read(coordinator.probe, resource)
            return reply(waited(resource, probe, time.monotonic() - start))

        progress = call.progress(timeout, f"{resource.uri} to be handed over")
        out: Reply = {}
        try:
            answer = await self.app.wait_for(look, give_up, timeout, progress)
            # The SDK drops the answer of a call its client cancelled: a cancel that arrived
            # while the last write ran is raised here, where the claim can still go back.
            await anyio.lowlevel.checkpoint()
            out = answer
            return out
        finally:
            if seq is not None and out.get("version") is None and not parked:  # no claim told
                unheard = Unheard(resource, agent_id, mode, call.by, seen)
                with anyio.CancelScope(shield=True):  # also when cancelled, or disconnected
                    try:
                        await self.app.write(coordinator.leave_queue, seq, unheard)
                    except AgentholdError:  # the database is down: leave once it is back
                        leave = functools.partial(coordinator.leave_queue, seq, unheard)
                        self.app.write_later(leave, coordinator.waiter_liveness)
                        raise


def one_or_many(tool: str, args: dict[str, Any], *, strings: bool) -> list[Any]:
    """The resources a call names: ``resource`` or the list ``resources``, never both."""
    one, many = args.get("resource"), args.get("resources")
    if one is None and many is None:
        raise ToolError(
            f"{tool} needs the argument 'resource' ({RESOURCE.description}), or 'resources' "
            "(a list)",
            f"Call {tool} again with resource, or resources for several.",
        )
    if one is not None and many is not None:
        raise ToolError(
            f"{tool} takes resource or resources, not both",
            f"Call {tool} again with resource (one) or resources (a list).",
        )
    if one is not None:
        return [one]
    what = "strings" if strings else "objects"
    if not isinstance(many, list) or not 1 <= len(many) <= MAX_SET:
        raise ToolError(
            f"resources must be a list of 1 to {MAX_SET} {what}, got {short(many)}",
            f"Pass resources as a JSON array of {what}.",
        )
    if strings and not all(isinstance(r, str) for r in many):
        raise ToolError(
            f"every item of resources must be a string, got {short(many)}",
            "Pass resources as a JSON array of paths or URIs.",
        )
    return many


def _release_item(item: Any) -> tuple[str, str, str | None]:
    hint = 'Give each item as {"resource": ..., "outcome": ..., "moved_to": ...}.'
    if not isinstance(item, dict) or not isinstance(item.get("resource"), str):
        raise ToolError(f"each item of resources must be an object with a resource, got "
                        f"{short(item)}", hint)  # fmt: skip
    extra = sorted(set(item) - {"resource", "outcome", "moved_to"})
    if extra:
        raise ToolError(f"an item of resources does not take {', '.join(map(repr, extra))}", hint)
    outcome = item.get("outcome") or "released"
    if outcome not in OUTCOMES:
        raise ToolError(
            f"outcome must be one of {', '.join(OUTCOMES)}; got {short(outcome)}",
            f"Use one of: {', '.join(OUTCOMES)}.",
        )
    moved_to = item.get("moved_to")
    if moved_to is not None and not isinstance(moved_to, str):
        raise ToolError(f"moved_to must be a string, got {short(moved_to)}", hint)
    return item["resource"], outcome, moved_to


def standard_tools(app: App) -> list[ToolSpec]:
    a = ClaimHandlers(app)
    return [
        ToolSpec(
            "agenthold_register",
            "Register as an agent",
            "Register once, before your first claim; pass the agent_id it returns to every "
            "later call. It survives reconnects: register again only if a call says it is "
            "unknown.",
            (
                Param(
                    "name",
                    "string",
                    "a short name for yourself, e.g. editor",
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
                    "what you are working on",
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
            "Claim a resource BEFORE you modify, create, delete or move it (reading needs "
            "none). 'claimed': yours until you release it (follow the hint if previous_outcome "
            "is present); 'already_claimed': you hold it; 'busy': another agent holds it or a "
            "directory or glob over it: work on something else or call agenthold_wait, then "
            "claim again. A path ending in / claims a directory; * ? [abc] and ** (any depth) "
            "make a glob; resources claims a list, all or none.",
            (RESOURCE, RESOURCES, AGENT_ID, MODE),
            read_only=False,
            destructive=False,
            idempotent=True,
            handler=a.claim,
        ),
        ToolSpec(
            "agenthold_release",
            "Release a claim, saying what you did",
            "Release what you claimed as soon as you are done, saying what you did: 'modified', "
            "'created', 'deleted', 'moved' (give moved_to) or 'released' (no change); the next "
            "holder is told. To rename, claim both paths, then release the old as moved "
            "(moved_to the new) and the new as created.",
            (
                RESOURCE,
                Param(
                    "resources",
                    "array",
                    "instead of resource: a list of {resource, outcome, moved_to}",
                    required=False,
                ),
                AGENT_ID,
                Param(
                    "outcome",
                    "string",
                    "what you did to it",
                    False,
                    "released",
                    enum=("released", "modified", "created", "deleted", "moved"),
                ),
                Param("moved_to", "string", "the new path, with outcome 'moved'", required=False),
            ),
            read_only=False,
            destructive=False,
            idempotent=False,
            handler=a.release,
        ),
        ToolSpec(
            "agenthold_status",
            "Check a resource",
            "See who holds a resource, or a directory or glob over it, without claiming it: "
            "'claimed' (held_by, held_as) or 'available' (with previous_outcome if there is "
            "news). resources checks a list at once.",
            (RESOURCE, RESOURCES),
            read_only=True,
            destructive=False,
            idempotent=True,
            handler=a.status,
        ),
        ToolSpec(
            "agenthold_wait",
            "Wait for a resource to be released",
            "Wait until a claimed resource is released: 'available' (follow the hint if "
            "previous_outcome is present) or 'timeout'; this does not claim it. claim true "
            "(with agent_id) queues you to be handed it: 'claimed'. You are blocked while you "
            "wait: wait only when you have nothing else to do.",
            (
                RESOURCE_ONE,
                WAIT_TIMEOUT,
                Param("agent_id", "string", "yours, with claim", required=False),
                Param("claim", "boolean", "queue to be handed it", required=False, default=False),
                Param("mode", "string", "with claim", required=False, enum=MODE.enum),
            ),
            read_only=False,
            destructive=False,
            idempotent=False,
            handler=a.wait,
        ),
    ]


def instructions(coordinator: Coordinator) -> str:
    """What a standard-mode server tells every client: the protocol and the workspaces."""
    lines = [
        "agenthold keeps agents working on the same files from overwriting each other.",
        "1. Call agenthold_register once and keep the agent_id it returns.",
        "2. Before you modify, create, delete or move a file, call agenthold_claim (a "
        "directory as src/api/, a glob as src/**/*.py, several with resources). 'busy': "
        "another agent is on it; work on something else or call agenthold_wait, then claim "
        "again.",
        "3. When done, call agenthold_release with what you did: modified, created, deleted, "
        "moved (with moved_to) or released (no change).",
        "4. To rename: claim both paths, rename, release the old as moved (moved_to the new) "
        "and the new as created.",
        "Reading needs no claim. Paths are relative to a workspace:",
    ]
    for ws in coordinator.resolver.workspaces:
        lines.append(f"- {ws.name}: {ws.root}")
    lines.append(
        "Files in another workspace: file://<workspace>/<path>; what is not a file: "
        "custom://<name>."
    )
    return "\n".join(lines)
