"""The episode store: every episode a run samples, one JSON line each (docs/concepts/run-dir.md).

``completions.jsonl`` holds the training episodes (every ``log_completions_every`` steps; every
step by default), ``eval_completions.jsonl`` the evaluations' (before, periodic, after). A line is
built from the :class:`agentrl.Trajectory` alone plus its scores (:func:`episode_record`), so a run
viewer (or a tracker plugin, from ``agentrl_on_rollout_end``'s trajectories) sees what the trainer
saw: each message marked with where it came from, following the token masks (``sampled``: a model
turn, loss mask 1; ``prompt``: before the first sampled turn, demonstrations included; ``env`` /
``tool``: what the environment answered), each turn's reward and finish reason, token counts,
tool calls, why an episode went unscored and, after the update, its advantage.

The files are append-only; a checkpoint records their sizes and ``--resume`` cuts them back, so
a resumed run's files equal a straight run's byte for byte (no timings are written).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from agentrl.rundir.links import open_nofollow
from agentrl.trajectory import TrainBatch, Trajectory

TRAIN_FILE = "completions.jsonl"
"""The training episodes (``step``, ``advantage``)."""
EVAL_FILE = "eval_completions.jsonl"
"""The evaluation episodes (``when``: ``before``, ``step N``, ``after``)."""
LIFTED = ("calls", "judgements")
"""Keys of ``Trajectory.info`` that become fields of the episode's line (:func:`lifted_fields`)."""
SOURCES = ("prompt", "sampled", "env", "tool")
"""Where a message came from: the prompt (demonstrations included), a model turn, the env, a tool."""


def due(every: int, step: int) -> bool:
    """Whether step ``step``'s episodes are written: ``every`` steps and the first (0: never)."""
    return bool(every) and (step == 1 or step % every == 0)


def message_sources(trajectory: Trajectory) -> list[str]:
    """One source per message of ``trajectory``: the last ``len(turns)`` assistant messages are
    the model's turns (each turn appends exactly one; its tokens are the loss mask's 1s):
    ``sampled``; what precedes the first of them is ``prompt``; what follows it is the env's
    answer: ``tool`` for a tool message, else ``env``."""
    messages = trajectory.messages
    assistant = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    sampled = set(assistant[max(0, len(assistant) - len(trajectory.turns)) :]) if trajectory.turns else set()
    first = min(sampled, default=len(messages))
    return [
        "sampled" if i in sampled else "prompt" if i < first else "tool" if m.get("role") == "tool" else "env"
        for i, m in enumerate(messages)
    ]


def episode_record(
    trajectory: Trajectory,
    *,
    index: int = 0,
    total: float = math.nan,
    components: Mapping[str, float] | None = None,
    unscored: str | None = None,
) -> dict[str, Any]:
    """One episode's line (without ``step`` / ``when``): ``index`` is its place in its group,
    ``total`` its total reward, ``components`` each reward function's score, ``unscored`` why it
    went unscored (None: scored). ``advantage`` is None until the update sets it."""
    turns, versions = trajectory.turns, trajectory.policy_versions
    sources = message_sources(trajectory)
    sampled_at = [i for i, source in enumerate(sources) if source == "sampled"]
    info = dict(trajectory.info)
    unseen = info.pop("unseen_messages", None) or []
    messages = [{**m, "source": s} for m, s in zip(trajectory.messages, sources, strict=True)]
    messages += [{**m, "source": "tool" if m.get("role") == "tool" else "env", "unseen": True} for m in unseen]
    sampled = trajectory.num_sampled_tokens
    record: dict[str, Any] = {
        "group": trajectory.group,
        "index": index,
        "task": {key: trajectory.task[key] for key in ("id", "answer") if key in trajectory.task},
        "reward": total,
        "rewards": dict(components or {}),
        "advantage": None,
        "unscored": unscored,
        "terminated": trajectory.terminated,
        "truncated": trajectory.truncated,
        "tokens": {
            "prompt": trajectory.prompt_length,
            "sampled": sampled,
            "env": len(trajectory.token_ids) - trajectory.prompt_length - sampled,
        },
        "tool_calls": trajectory.num_tool_calls,
        "tool_errors": sum(turn.tool_errors for turn in turns),
    }
    if versions is not None:
        drawn = [v for v in versions if v >= 0]
        record["policy_version"] = min(drawn, default=None)
    if trajectory.segments:
        record["segments"] = len(trajectory.segments)
    record.update(lifted_fields(info))
    record["info"] = info
    late = len(turns) - len(sampled_at)  # turns without a message of their own (a rollout that kept none) come first
    record["turns"] = [
        _turn(turn, sampled_at[k - late] if k >= late else None, versions) for k, turn in enumerate(turns)
    ]
    record["messages"] = messages
    return plain(record)


def token_texts(tokenizer: Any) -> Callable[[list[int]], list[str]]:
    """``ids -> one string per id`` through ``tokenizer`` (special tokens kept, spaces as they are),
    each id decoded once and remembered."""
    known: dict[int, str] = {}

    def decode(ids: list[int]) -> list[str]:
        new = sorted({int(i) for i in ids} - known.keys())
        if new:
            texts = tokenizer.batch_decode([[i] for i in new], clean_up_tokenization_spaces=False)
            known.update(zip(new, texts, strict=True))
        return [known[int(i)] for i in ids]

    return decode


def token_view(trajectory: Trajectory, decode: Callable[[list[int]], list[str]]) -> dict[str, Any]:
    """The episode's tokens as the trainer saw them: one entry per training row (an agent episode's
    earlier ``segments`` first, then its own), each with every token's ``text`` (``decode``: ids ->
    one string per id), its ``kind`` (one letter per token: ``s`` sampled, i.e. loss mask 1; ``p``
    before the first sampled token; ``e`` after it: env and tool answers) and ``sampler_logprob``
    (the engine's, 4 decimals; None off the sampled tokens)."""
    return {"segments": [_token_row(row, decode) for row in [*trajectory.segments, trajectory]]}


def with_token_views(
    records: list[dict[str, Any]], trajectories: list[Trajectory], decode: Callable[[list[int]], list[str]]
) -> list[dict[str, Any]]:
    """``records`` (the lines of ``trajectories``, in order) each with its :func:`token_view`."""
    return [{**r, "token_view": token_view(t, decode)} for r, t in zip(records, trajectories, strict=True)]


def _token_row(row: Trajectory, decode: Callable[[list[int]], list[str]]) -> dict[str, Any]:
    """One training row's ``text``, ``kind`` and ``sampler_logprob`` (:func:`token_view`)."""
    mask = row.loss_mask
    first = next((i for i, m in enumerate(mask) if m), len(mask))
    kind = "".join("s" if m else "p" if i < first else "e" for i, m in enumerate(mask))
    logprobs = [round(float(lp), 4) if m else None for lp, m in zip(row.sampler_logprobs, mask, strict=True)]
    return {"text": decode(list(row.token_ids)), "kind": kind, "sampler_logprob": plain(logprobs)}


def with_trainer_values(records: list[dict[str, Any]], rows: list[dict[str, list[float]] | None]) -> None:
    """Add each training row's ``trainer_logprob`` and ``entropy`` (``rows``: per row of the
    batch, the values at each of its tokens; None: not computed) to ``records``' ``token_view``
    segments in place, None off the sampled tokens (rows are the records' segments in order, as in
    :func:`with_advantages`); a row whose length differs from its segment's is left out."""
    at = 0
    for record in records:
        segments = (record.get("token_view") or {}).get("segments", [])
        for segment, values in zip(segments, rows[at : at + len(segments)], strict=False):
            if values is None or any(len(v) != len(segment["kind"]) for v in values.values()):
                continue
            for key, numbers in values.items():
                segment[key] = [
                    round(x, 4) if k == "s" else None for x, k in zip(numbers, segment["kind"], strict=True)
                ]
        at += len(segments) if segments else int(record.get("segments") or 0) + 1


def lifted_fields(info: dict[str, Any]) -> dict[str, Any]:
    """The :data:`LIFTED` keys popped from ``info`` (a copy of the trajectory's), as the line's own
    fields: ``calls`` (a rollout's model calls, e.g. an agent program's endpoint calls) and
    ``judgements`` (reward functions' details, :class:`agentrl.Scored`); absent keys stay absent."""
    return {key: info.pop(key) for key in LIFTED if key in info}


def _turn(turn: Any, message: int | None, versions: list[int] | None) -> dict[str, Any]:
    """One turn's entry: its message's index, sampled tokens, reward, finish reason and tool calls."""
    out = {
        "message": message,
        "tokens": turn.end - turn.start,
        "reward": turn.reward,
        "finish_reason": turn.finish_reason,
        "tool_calls": turn.tool_calls,
        "tool_errors": turn.tool_errors,
    }
    if versions is not None and turn.end > turn.start:
        out["policy_version"] = versions[turn.start]
    return out


def plain(value: Any) -> Any:
    """``value`` as plain JSON: non-finite floats become None, tuples lists, keys strings, and
    anything else JSON cannot hold its ``str``."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    try:
        number = float(value)  # numpy and torch scalars
    except (TypeError, ValueError):
        return str(value)
    return number if math.isfinite(number) else None


def row_advantages(batch: TrainBatch) -> list[float | None]:
    """Per row of ``batch``: the mean advantage over its trained tokens, to 6 significant digits
    (summed in float64: the same on any batch shape or process count); None: no advantages, or
    the row trains no token (an unscored episode)."""
    advantages = batch.extras.get("advantages")
    if advantages is None:
        return [None] * batch.num_rows
    out: list[float | None] = []
    for values, mask in zip(advantages.detach().cpu(), batch.loss_mask.detach().cpu(), strict=True):
        trained = values[mask > 0].double()
        out.append(float(f"{float(trained.sum()) / len(trained):.6g}") if len(trained) else None)
    return out


def row_token_values(batch: TrainBatch) -> list[dict[str, list[float]] | None]:
    """Per row of ``batch``: its ``trainer_logprob`` and ``entropy`` at each of its tokens (from
    ``batch.extras``' ``trainer_logprobs`` / ``trainer_entropy``, :func:`with_trainer_values`
    keeps the sampled ones); None per row when the trainer did not compute them."""
    logprobs, entropy = batch.extras.get("trainer_logprobs"), batch.extras.get("trainer_entropy")
    if logprobs is None or entropy is None:
        return [None] * batch.num_rows
    lengths = batch.lengths.tolist()
    pairs = zip(logprobs.detach().cpu().tolist(), entropy.detach().cpu().tolist(), lengths, strict=True)
    return [{"trainer_logprob": lp[:n], "entropy": h[:n]} for lp, h, n in pairs]


def with_advantages(records: list[dict[str, Any]], rows: list[float | None]) -> list[dict[str, Any]]:
    """``records`` with each episode's ``advantage``: the mean of its rows' (an agent episode's
    earlier ``segments`` are rows before its own, :func:`agentrl.trajectory.with_segments`)."""
    out, at = [], 0
    for record in records:
        n = int(record.get("segments") or 0) + 1
        mine = [v for v in rows[at : at + n] if v is not None]
        at += n
        out.append({**record, "advantage": float(f"{sum(mine) / len(mine):.6g}") if mine else None})
    return out


def append(path: Path, head: Mapping[str, Any], records: Iterable[Mapping[str, Any]]) -> None:
    """Append ``records`` to ``path``, one compact JSON line each, ``head`` (``step`` or ``when``)
    first; written in one go, so a failed write leaves no line of them half-way unless the disk
    filled mid-write (``--resume`` cuts the file back to its checkpoint either way)."""
    text = "".join(json.dumps({**head, **record}, separators=(",", ":")) + "\n" for record in records)
    if not text:
        return
    with open_nofollow(path, "a") as f:
        f.write(text)


def eval_label(step: int, final: bool) -> str:
    """``before`` (step 0), ``step N`` or ``after`` (the run's last evaluation)."""
    return "after" if final else "before" if step == 0 else f"step {step}"
