"""The catalogue of tool sets: which sets a server can serve, what each is called, and the
wording that is about the catalogue rather than one tool (the unknown-tool hint, the server's
instructions).

Decisions behind it:
- A tool set is a module that builds its ToolSpecs over an ``App`` (see toolkit.py); this
  catalogue is the one place that names them. Adding a set is one module and one line in
  TOOL_SETS (and its name in ``cli.TOOL_SET_NAMES``, which must not import mcp).
- ``--tools`` takes one set or a comma list (``standard,advanced``); the order is the order of
  the tools in tools/list.
- The library's errors carry hints that name its methods; a tool set maps them to hints that
  name its tools (``error_hints``), so the library reads right from Python and over MCP.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from agenthold.claims.coordinator import Coordinator
from agenthold.serve.claim_tools import ERROR_HINTS as STANDARD_HINTS
from agenthold.serve.claim_tools import STANDARD_NAMES, instructions, standard_tools
from agenthold.serve.message_tools import ERROR_HINTS as MESSAGES_HINTS
from agenthold.serve.message_tools import MESSAGES_NAMES, messages_tools
from agenthold.serve.message_tools import instructions as messages_instructions
from agenthold.serve.state_tools import ADVANCED_NAMES, advanced_tools
from agenthold.serve.state_tools import ERROR_HINTS as ADVANCED_HINTS
from agenthold.serve.toolkit import App, ToolSpec, short

__all__ = ["DEFAULT_TOOLS", "TOOL_SETS", "ToolSet", "parse_tool_sets"]


@dataclass(frozen=True)
class ToolSet:
    name: str
    names: frozenset[str]  # the tools it holds
    build: Callable[[App], list[ToolSpec]]
    instructions: Callable[[Coordinator], str] | None = None  # what it tells every client
    # The hints its calls get for library errors, in tool names (else the error's own hint).
    error_hints: Mapping[type[Exception], str] = field(default_factory=dict)

    def hint_for(self, error: Exception) -> str | None:
        """This set's hint for ``error`` (its class or the nearest base that has one)."""
        return next(
            (self.error_hints[c] for c in type(error).__mro__ if c in self.error_hints), None
        )


TOOL_SETS: dict[str, ToolSet] = {
    "standard": ToolSet("standard", STANDARD_NAMES, standard_tools, instructions, STANDARD_HINTS),
    "advanced": ToolSet("advanced", ADVANCED_NAMES, advanced_tools, None, ADVANCED_HINTS),
    "messages": ToolSet(
        "messages",
        MESSAGES_NAMES,
        messages_tools,
        lambda _: messages_instructions(),
        MESSAGES_HINTS,
    ),
}
DEFAULT_TOOLS = "standard"


def parse_tool_sets(text: str) -> tuple[str, ...]:
    """``standard`` or ``standard,advanced`` as set names; ValueError naming a bad one."""
    names = [part.strip() for part in text.split(",")]
    for name in names:
        if name not in TOOL_SETS:
            known = ", ".join(TOOL_SETS)
            raise ValueError(f"unknown tool set {name!r}; the sets are: {known}")
    if len(set(names)) != len(names):
        raise ValueError(f"a tool set is named twice in {text!r}")
    return tuple(names)


def build_tools(app: App, sets: Sequence[str]) -> list[ToolSpec]:
    return [spec for name in sets for spec in TOOL_SETS[name].build(app)]


def server_instructions(sets: Sequence[str], coordinator: Coordinator) -> str | None:
    """The instructions of every served set that has any, in order (None if none has)."""
    told = [tell(coordinator) for name in sets if (tell := TOOL_SETS[name].instructions)]
    return "\n\n".join(told) if told else None


def unknown_tool_hint(name: object, sets: Sequence[str], served: Sequence[str]) -> str:
    """The hint for a call of a tool this server does not have: which set holds it, if one
    does, and the tools there are."""
    names = ", ".join(served)
    if isinstance(name, str):
        for tool_set in TOOL_SETS.values():
            if tool_set.name not in sets and name in tool_set.names:
                return (
                    f"{name} is one of the {tool_set.name} tools, which this server does not "
                    f"serve (it runs with --tools {','.join(sets)}). Use: {names}."
                )
    return f"The tools here are: {names}."


def unknown_tool_message(name: object) -> str:
    return f"there is no tool named {short(name)} on this server"
