"""``agenthold.messages``, kept importable: the message bus lives in :mod:`agenthold.bus`, and
this module gives the names of its ``MessageBus`` module (the same ``__all__``)."""

from __future__ import annotations

from agenthold.bus.messagebus import *  # noqa: F403 - every public name, by the module's __all__
from agenthold.bus.messagebus import __all__ as __all__
