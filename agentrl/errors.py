"""One error hierarchy for everything a user can trigger (never bare ``assert``)."""

from __future__ import annotations

import difflib
import re
import signal
from collections.abc import Iterable


class AgentRLError(Exception):
    """Base class of every error agentrl raises on purpose."""


class ConfigError(AgentRLError):
    """A config key has a bad value, or two keys contradict each other."""


class PluginError(AgentRLError):
    """A plugin failed to load, registered a duplicate name, or raised."""


class EnvError(AgentRLError):
    """An environment was misused or broke its contract."""


class EnvLibraryError(EnvError):
    """The library an env adapter wraps raised inside ``reset`` or ``step``: ``on_call_error`` applies."""


class RewardError(AgentRLError):
    """A reward function raised or returned something unusable."""


class EngineError(AgentRLError):
    """A generation engine failed or returned inconsistent output."""


class ModelError(AgentRLError):
    """A model could not be found, fetched, converted or loaded."""


class TrainingError(AgentRLError):
    """Training cannot go on (e.g. too many non-finite steps in a row); what was written is kept."""


class CheckpointError(AgentRLError):
    """A checkpoint could not be written, or one on disk is damaged or would need code run to load."""


class TrainingInterrupted(KeyboardInterrupt):
    """A signal (Ctrl-C's SIGINT, SIGTERM, SIGHUP) stopped a run; ``checkpoint`` is what ``--resume``
    continues from (None: nothing); ``signum``: that signal (``agentrl train`` exits 128 + signum)."""

    def __init__(self, message: str, checkpoint: str | None, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.checkpoint, self.signum = checkpoint, int(signum)


class RunDirBusyError(AgentRLError):
    """Another live process trains in the run dir (it holds ``run.lock``)."""


class TemplateError(AgentRLError):
    """A chat template broke the prefix property multi-turn training relies on."""


def unknown_name_message(kind: str, name: str, known: Iterable[str], hint: str = "") -> str:
    """Build 'unknown <kind> NAME; did you mean X? installed: a, b' for a bad component name."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1)
    msg = f"unknown {kind} {name!r}"
    msg += f"; did you mean {close[0]!r}?" if close else ";"
    msg += f" Installed: {', '.join(known) if known else '(none)'}."
    if hint:
        msg += f" {hint}"
    return msg


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def one_line(exc: BaseException, limit: int = 200) -> str:
    """``exc`` as one short plain line, ``Type: message`` (a library's boxed, coloured or
    multi-line message flattened, so it can sit inside an agentrl error)."""
    text = " ".join(_ANSI.sub("", str(exc)).replace("*", " ").split())
    return f"{type(exc).__name__}: {text[:limit]}"
