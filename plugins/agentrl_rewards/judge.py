"""The ``judge`` reward scheme: an LLM grades each episode against a rubric.

``--reward judge:WHO[:WEIGHT]`` where ``WHO`` is

* ``policy``: the run's own engine (the weights being trained: no second copy), one greedy
  ``generate`` for every episode of the call that is not cached;
* ``openai``: an OpenAI-compatible endpoint (``base_url``, ``model``, the key read from the
  environment variable ``api_key_env``), ``max_concurrency`` requests at once, each at most
  ``timeout_s`` from start to finished reply (:mod:`agentrl_rewards.judge_endpoint`);
* anything else: a local causal-LM folder or a model alias (``judge:smollm2-135m``, the default
  model, converted into the cache on first use as ``--model`` does), checked for the role
  (:mod:`agentrl.model.roles`), loaded once per run and sampled greedily with
  ``transformers``' ``generate`` (``batch_size`` prompts at a time, left-padded).

The rubric is a ``str.format`` template (the default, or the file ``rubric`` names) sent as one
user message; placeholders: ``{prompt}`` (the last user message before the model's first reply),
``{completion}`` (the final reply, or every message from the first reply on as ``role: content``
blocks in a multi-turn episode), ``{reference}`` (the task's ``answer``, empty when it has none)
and any task column (``{question}``, ``{answer}``, ...); literal braces are doubled. The reply is
read by :func:`parse_score`: the number after the last ``Score:``, else the last number (counted
in ``judge/unformatted``: a judge that ignores the format often just repeats a number from the
task), which must lie in ``[0, max_score]``; it is mapped to ``[0, 1]``. A reply that gives none is
a parse failure: the episode is not scored (None) and counted; a call in which no reply parses
warns, naming the judge, and when the judge is the run's only reward ``max_nonfinite_steps`` such
calls in a row stop the run with that line. ``reply_prefix`` (for example
``Score:``) writes the start of a local judge's reply for it. Replies are cached by judge prompt (the episode's
prompt, completion and task) for the whole run.

An endpoint request that fails or times out follows the run's ``on_call_error``: ``skip`` leaves
the episode unscored (counted, warned about once), ``fail`` stops the run naming the judge.
Metrics after each rollout: ``judge/judged`` (replies asked for), ``judge/cache_hits``,
``judge/parse_failures``, ``judge/unformatted`` (scores read from a reply's last number, no
``Score:`` line; counted per reply asked for) and ``judge/errors``. Options: the ``plugins.judge`` settings section.
"""

from __future__ import annotations

import re
import string
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import Field

from agentrl import (
    ConfigError,
    RewardContext,
    RewardError,
    SamplingParams,
    Scored,
    Trajectory,
    import_extra,
    load_for_role,
    load_tokenizer_for_role,
    one_line,
)
from agentrl_rewards.judge_endpoint import EndpointBackend

SECTION = "judge"
DEFAULT_RUBRIC = """You are grading a reply to a task.

Task:
{prompt}

Reference answer (empty if none): {reference}

Reply to grade:
{completion}

How correct is the reply? Think briefly, then end with a line "Score: N" where N is a whole number
from 0 (wrong or no answer) to 10 (fully correct)."""
SCORE = re.compile(r"score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
Backend = Callable[[list[str]], list["str | Exception"]]
"""Judge prompts -> one reply each, or the exception that request failed with (an endpoint's)."""


@dataclass(frozen=True)
class JudgeConfig:
    """The ``plugins.judge`` section: the rubric, the parser's scale and each judge kind's options."""

    rubric: str = ""
    """A file holding the rubric template (module docstring for its placeholders); empty: the default."""
    max_score: Annotated[float, Field(gt=0)] = 10.0
    """The top of the rubric's scale: a parsed score N in [0, max_score] gives the reward N / max_score."""
    max_new_tokens: Annotated[int, Field(ge=1)] = 128
    """Tokens the judge may write per reply (greedy)."""
    batch_size: Annotated[int, Field(ge=1)] = 8
    """Prompts per ``generate`` of a local judge model."""
    base_url: str = ""
    """``judge:openai``: the endpoint, e.g. ``http://localhost:8000/v1``."""
    model: str = ""
    """``judge:openai``: the model name sent with each request."""
    api_key_env: str = "OPENAI_API_KEY"
    """``judge:openai``: the environment variable holding the API key (unset: ``EMPTY``)."""
    timeout_s: Annotated[float, Field(gt=0)] = 60.0
    """``judge:openai``: seconds one request may take, from start to finished reply (however slowly the
    server sends it: it is then cancelled); past it, ``on_call_error``."""
    max_concurrency: Annotated[int, Field(ge=1)] = 8
    """``judge:openai``: requests in flight at once."""
    reply_prefix: str = ""
    """Text written as the start of the judge's reply, which goes on from it (``judge:policy`` and
    ``judge:PATH``; ``judge:openai`` refuses one: a chat endpoint starts its own reply). ``Score:``
    makes a small judge give its number at once (with a rubric that asks for no reasoning); the
    parser reads the prefix and the reply together."""


def parse_score(reply: str, max_score: float = 10.0) -> float | None:
    """The reward in [0, 1] a judge's reply gives: the number after its last ``Score:`` (else its
    last number) divided by ``max_score``; None when there is none or it lies outside [0, max_score]."""
    found = SCORE.findall(reply) or NUMBER.findall(reply)
    if not found:
        return None
    value = float(found[-1])
    return value / max_score if 0 <= value <= max_score else None


class Judge:
    """An LLM judge as a reward function ``fn(trajectories)``, cached per judge prompt."""

    def __init__(
        self, name: str, backend: Backend, template: str, options: JudgeConfig, skips: bool, patience: int = 0
    ) -> None:
        self.name, self.backend, self.template, self.options, self.skips = name, backend, template, options, skips
        self.patience = patience
        """Calls in a row in which no reply parsed after which the judge stops the run (0: never); set
        when the judge is the run's only reward, where such a call leaves every episode unscored."""
        self.cache: dict[str, float | None] = {}
        self.replies: dict[str, str] = {}
        """Judge prompt -> the judge's raw reply (beside its score in ``cache``)."""
        self.counts = dict.fromkeys(("judged", "cache_hits", "parse_failures", "unformatted", "errors"), 0)
        self.warned = False
        self.unparsed: list[str] = []
        """The replies of the calls in a row so far in which no reply parsed."""
        self.unparsed_calls = 0

    def __call__(self, trajectories: list[Trajectory]) -> list[Scored]:
        """One score in [0, 1] (None: parse failure or failed request) per episode, with the judge's
        prompt and raw reply (None: the request failed) as its details (the episode's ``judgements``)."""
        prompts = [render(self.template, t) for t in trajectories]
        todo = [p for p in dict.fromkeys(prompts) if p not in self.cache]
        failed: set[str] = set()
        replies: list[str] = []
        for index, (prompt, reply) in enumerate(zip(todo, self.backend(todo) if todo else [])):
            if isinstance(reply, Exception):
                self._failed(index, reply)
                failed.add(prompt)
            else:
                replies.append(reply)
                self.replies[prompt] = reply
                self.cache[prompt] = parse_score(reply, self.options.max_score)
                self.counts["unformatted"] += self.cache[prompt] is not None and not SCORE.search(reply)
        self._watch_parsing(replies, [self.cache[p] for p in todo if p not in failed])
        self.counts["judged"] += len(todo)
        self.counts["cache_hits"] += len(prompts) - len(todo)
        scores = [None if p in failed else self.cache[p] for p in prompts]
        self.counts["parse_failures"] += sum(s is None and p not in failed for s, p in zip(scores, prompts))
        self.counts["errors"] += sum(p in failed for p in prompts)
        return [
            Scored(score, {"prompt": p, "reply": None if p in failed else self.replies[p]})
            for score, p in zip(scores, prompts)
        ]

    def _failed(self, index: int, error: Exception) -> None:
        what = f"judge {self.name!r} failed on request {index} of the batch: {one_line(error)}"
        if not self.skips:
            raise RewardError(
                f"{what} (on_call_error=fail; with 'skip' the episode is left unscored and counted in judge/errors)"
            ) from error
        if not self.warned:
            self.warned = True
            warnings.warn(
                f"{what}; such episodes are left unscored (on_call_error=skip) and counted in "
                "judge/errors; later failures are not warned about",
                RuntimeWarning,
                stacklevel=3,
            )

    def _watch_parsing(self, replies: list[str], scores: list[float | None]) -> None:
        """Warn at the first call in which no reply parsed, naming the judge and a reply; stop the
        run after ``patience`` such calls in a row (a call with a parsed reply ends the streak)."""
        if not replies:
            return
        if any(score is not None for score in scores):
            self.unparsed, self.unparsed_calls = [], 0
            return
        self.unparsed += replies
        self.unparsed_calls += 1
        what = (
            f"{self.name}: 0 of {len(self.unparsed)} replies parsed"
            + (f" in the last {self.unparsed_calls} calls" if self.unparsed_calls > 1 else "")
            + f" (first: {self.unparsed[0][:80]!r}); a reply needs 'Score: N' or a last number N in "
            f"[0, {self.options.max_score:g}]"
        )
        advice = (
            f"check the judge's replies against plugins.{SECTION}.rubric, reply_prefix, max_new_tokens and max_score"
        )
        if self.patience and self.unparsed_calls >= self.patience:
            raise RewardError(
                f"{what}. The judge is the run's only reward (env_reward_weight=0), so no episode was scored; {advice}"
            )
        if self.unparsed_calls == 1:
            warnings.warn(
                f"{what}; those episodes are not scored by the judge (counted in judge/parse_failures); {advice}",
                RuntimeWarning,
                stacklevel=3,
            )

    def pop_metrics(self) -> dict[str, float]:
        """Counts since the last call (logged as ``judge/<key>``)."""
        out = {key: float(n) for key, n in self.counts.items()}
        self.counts = dict.fromkeys(self.counts, 0)
        return out


def render(template: str, trajectory: Trajectory) -> str:
    """The judge prompt for one episode (module docstring for the placeholders)."""
    messages = trajectory.messages
    start = first_reply(trajectory)
    users = [m for m in messages[:start] if m.get("role") == "user"]
    reply = messages[start:]
    completion = (
        str(reply[0].get("content") or "")
        if len(reply) == 1
        else "\n\n".join(f"{m.get('role', '')}: {m.get('content') or ''}" for m in reply)
    )
    values = {str(k): "" if v is None else str(v) for k, v in trajectory.task.items()}
    values.update(
        prompt=str(users[-1].get("content") or "") if users else "",
        completion=completion,
        reference=values.get("answer", ""),
    )
    return template.format_map(values)


def first_reply(trajectory: Trajectory) -> int:
    """Index in ``messages`` of the model's first reply (counted back from the end, one assistant
    message per turn, so a few-shot prompt's assistant messages stay in the prompt)."""
    remaining = len(trajectory.turns)
    for index in range(len(trajectory.messages) - 1, -1, -1):
        if remaining and trajectory.messages[index].get("role") == "assistant":
            remaining -= 1
            if remaining == 0:
                return index
    return len(trajectory.messages)


def load_template(options: JudgeConfig, columns: list[str]) -> str:
    """The rubric template, its placeholders checked against what an episode provides."""
    template = DEFAULT_RUBRIC
    if options.rubric:
        path = Path(options.rubric).expanduser()
        if not path.is_file():
            raise ConfigError(f"plugins.{SECTION}.rubric={options.rubric!r}: no such file")
        template = path.read_text()
    allowed = {"prompt", "completion", "reference", *columns}
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ConfigError(f"plugins.{SECTION}.rubric: not a format template ({exc}); double literal braces") from None
    for name in fields:
        if name not in allowed:
            raise ConfigError(
                f"plugins.{SECTION}.rubric has placeholder {{{name}}}; allowed: "
                + ", ".join(f"{{{a}}}" for a in sorted(allowed))
            )
    return template


def policy_backend(context: RewardContext, options: JudgeConfig) -> Backend:
    """Replies from the run's own engine: one greedy ``generate`` per call."""

    def judge(prompts: list[str]) -> list[str | Exception]:
        engine, tokenizer = context.engine, context.tokenizer
        if engine is None or tokenizer is None:
            raise RewardError("judge:policy needs the run's engine and tokenizer, which are not built yet")
        ids = [chat_ids(tokenizer, prompt, options.reply_prefix) for prompt in prompts]
        generations = engine.generate(ids, SamplingParams(max_new_tokens=options.max_new_tokens, temperature=0.0))
        return [options.reply_prefix + tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in generations]

    return judge


def chat_ids(tokenizer: Any, prompt: str, reply_prefix: str = "") -> list[int]:
    """``prompt`` as one user message in the tokenizer's chat template, ready for the reply (which
    starts with ``reply_prefix``, written here)."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(text + reply_prefix, add_special_tokens=False)["input_ids"])


def local_backend(path: str, options: JudgeConfig, device: Any) -> Backend:
    """Replies from the causal LM at ``path``, loaded once, greedy, ``batch_size`` prompts per generate."""
    # Checked for the role first (agentrl.model.roles): a causal LM with its tokenizer, no weight
    # freshly initialised; a sequence-classification folder is refused, not given a new LM head.
    model = load_for_role("judge", path).to(device).eval()
    tokenizer = load_tokenizer_for_role("judge", path)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @torch.no_grad()
    def judge(prompts: list[str]) -> list[str | Exception]:
        replies: list[str | Exception] = []
        for start in range(0, len(prompts), options.batch_size):
            batch = [chat_ids(tokenizer, p, options.reply_prefix) for p in prompts[start : start + options.batch_size]]
            width = max(len(ids) for ids in batch)
            input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch], device=model.device)
            mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=model.device)
            out = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                do_sample=False,
                pad_token_id=pad,
                max_new_tokens=options.max_new_tokens,
            )  # (B, width + new)
            replies += [options.reply_prefix + tokenizer.decode(row[width:], skip_special_tokens=True) for row in out]
        return replies

    return judge


def openai_backend(options: JudgeConfig) -> Backend:
    """Replies from an OpenAI-compatible endpoint; a failed or timed-out request is its exception."""
    if not options.base_url or not options.model:
        raise ConfigError(
            f"judge:openai needs plugins.{SECTION}.base_url and plugins.{SECTION}.model "
            f"(got base_url={options.base_url!r}, model={options.model!r})"
        )
    if options.reply_prefix:
        raise ConfigError(
            f"judge:openai cannot take plugins.{SECTION}.reply_prefix={options.reply_prefix!r}: a chat "
            "endpoint writes its reply from the start (use a rubric that asks for 'Score: N' instead)"
        )
    openai = import_extra("openai", "judge:openai needs the openai package: pip install openai", ConfigError)
    return EndpointBackend(openai, options)


def is_model_path(argument: str) -> bool:
    """Whether a ``judge:`` argument names a local model folder (anything but ``policy`` and ``openai``;
    a model alias is kept as written whatever folder has its name)."""
    return argument not in ("policy", "openai")


def judge_scheme(argument: str, context: RewardContext) -> Judge:
    """``judge:policy``, ``judge:openai`` or ``judge:PATH`` with the run's ``plugins.judge`` options."""
    options = context.settings.get(SECTION) or JudgeConfig()
    template = load_template(options, list(context.columns))
    if argument == "policy":
        backend = policy_backend(context, options)
    elif argument == "openai":
        backend = openai_backend(options)
    else:
        backend = local_backend(argument, options, context.device)
    config = context.config
    skips = getattr(config, "on_call_error", "fail") == "skip"
    rewards = list(getattr(config, "rewards", None) or [])
    only = getattr(config, "env_reward_weight", 1.0) == 0 and len(rewards) == 1 and rewards[0].startswith("judge:")
    patience = int(getattr(config, "max_nonfinite_steps", 3)) if only else 0
    return Judge(f"judge:{argument}", backend, template, options, skips, patience)
