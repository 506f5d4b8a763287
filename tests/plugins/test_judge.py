"""``--reward judge:...``: an LLM judge with a rubric, a score parser, a cache and the run's error policy."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cli_in_process import agentrl_in_process

from agentrl.config.train import TrainConfig
from agentrl.errors import ConfigError, RewardError
from agentrl.plugins import load_plugins
from agentrl.rewards.schemes import RewardContext, with_absolute_paths
from agentrl.rewards.specs import resolve_rewards
from agentrl.testing import build_tiny_model, make_trajectory
from agentrl_rewards.judge import DEFAULT_RUBRIC, JudgeConfig, judge_scheme, parse_score, render


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("The reply is right.\nScore: 7", 0.7),
        ("score = 10", 1.0),
        ("**Score:** 0", 0.0),
        ("Steps 1, 2 and 3 are fine. Score: 4.5", 0.45),
        ("I would give it 8", 0.8),  # no "Score:": the last number
        ("Score: 3, though 2 steps were wrong", 0.3),  # "Score:" wins over a later number
        ("Score: 11", None),  # out of range
        ("Score: -1", None),
        ("I cannot grade this.", None),
        ("", None),
    ],
)
def test_parse_score(reply, score):
    assert parse_score(reply) == (pytest.approx(score) if score is not None else None)


def test_parse_score_on_another_scale():
    assert parse_score("Score: 4", max_score=5) == pytest.approx(0.8) and parse_score("Score: 6", max_score=5) is None


def episode(question: str, reply: str, answer: str = "4") -> object:
    return make_trajectory(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": question},
            {"role": "assistant", "content": reply},
        ],
        {"question": question, "answer": answer},
    )


def values(scored: list) -> list:
    """The scores of a judge's :class:`agentrl.Scored` returns."""
    return [s.value for s in scored]


def test_render_fills_prompt_completion_reference_and_task_columns():
    text = render("Q={prompt} A={completion} R={reference} q={question}", episode("2+2?", "\\boxed{4}"))
    assert text == "Q=2+2? A=\\boxed{4} R=4 q=2+2?"
    multi = make_trajectory(
        [
            {"role": "user", "content": "17*3"},
            {"role": "assistant", "content": "call"},
            {"role": "tool", "content": "51"},
            {"role": "assistant", "content": "51"},
        ],
        {},
    )
    assert render("{prompt}|{completion}|{reference}", multi) == "17*3|assistant: call\n\ntool: 51\n\nassistant: 51|"


def context(**settings) -> RewardContext:
    config = TrainConfig(on_call_error=settings.pop("on_call_error", "skip"))
    return RewardContext(config=config, settings={"judge": JudgeConfig(**settings)}, columns=["answer", "question"])


def test_a_rubric_placeholder_no_episode_has_is_refused(tmp_path):
    (tmp_path / "rubric.txt").write_text("Grade {completion} against {solution}.")
    with pytest.raises(ConfigError, match=r"plugins.judge.rubric has placeholder \{solution\}; allowed: \{answer\}"):
        judge_scheme("policy", context(rubric=str(tmp_path / "rubric.txt")))
    with pytest.raises(ConfigError, match=r"plugins.judge.rubric='/nope.txt': no such file"):
        judge_scheme("policy", context(rubric="/nope.txt"))
    with pytest.raises(ConfigError, match="judge:openai needs plugins.judge.base_url and plugins.judge.model"):
        judge_scheme("openai", context())
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "judge: /no/such/judge does not exist; judge:PATH takes a causal LM folder (AutoModelForCausalLM) with "
            "its tokenizer or a model alias (smollm2-135m) (or use judge:policy, judge:openai)"
        ),
    ):
        judge_scheme("/no/such/judge", context())
    with pytest.raises(ConfigError, match=r"judge: smollm2-136m does not exist; .* or a model alias \(smollm2-135m\)"):
        judge_scheme("smollm2-136m", context())  # a misspelt alias
    with pytest.raises(ConfigError, match="judge:openai cannot take plugins.judge.reply_prefix='Score:'"):
        judge_scheme("openai", context(base_url="http://localhost:1/v1", model="m", reply_prefix="Score:"))


class CountingEngine:
    """The real hf engine, counting its generate calls and prompts."""

    def __init__(self, engine) -> None:
        self.engine, self.calls, self.prompts = engine, 0, 0

    def generate(self, prompts, sampling):
        self.calls += 1
        self.prompts += len(prompts)
        assert sampling.temperature == 0.0
        return self.engine.generate(prompts, sampling)


@pytest.fixture(scope="module")
def policy_engine(tokenizer):
    model = build_tiny_model(len(tokenizer))
    engine = load_plugins().registry.get("engine", "hf").factory(model=model, tokenizer=tokenizer, config=TrainConfig())
    return CountingEngine(engine)


def test_the_policy_engine_judges_a_batch_in_one_generate_and_caches(policy_engine, tokenizer):
    ctx = context(max_new_tokens=6)
    judge = judge_scheme("policy", ctx)
    ctx.engine, ctx.tokenizer = policy_engine, tokenizer  # filled in once the run has built them
    batch = [episode("2+2?", "4"), episode("3+3?", "6"), episode("2+2?", "4"), episode("5+5?", "9")]
    before = policy_engine.calls, policy_engine.prompts
    scores = values(judge(batch))
    assert (policy_engine.calls - before[0], policy_engine.prompts - before[1]) == (1, 3)  # one generate, 3 unique
    assert scores[0] == scores[2] and all(s is None or 0 <= s <= 1 for s in scores)
    counts = judge.pop_metrics()
    assert counts == {
        "judged": 3.0,
        "cache_hits": 1.0,
        "parse_failures": float(sum(s is None for s in scores)),
        "unformatted": float(len({b.messages[1]["content"] for b, s in zip(batch, scores) if s is not None})),
        "errors": 0.0,
    }  # a random model never writes "Score:": every score it gives is its last number
    assert values(judge(batch[:2])) == scores[:2] and policy_engine.calls == before[0] + 1  # cached: no engine call
    assert judge.pop_metrics()["cache_hits"] == 2.0


def test_the_reply_prefix_is_written_for_the_judge_and_read_with_its_reply(policy_engine, tokenizer, tiny_model_dir):
    """A prefix ending in a score line: whatever a random model writes after it (a new line first),
    every episode gets that score, read from a ``Score:`` line."""
    recorded = []

    class Recording:
        def generate(self, prompts, sampling):
            recorded.extend(prompts)
            return policy_engine.generate(prompts, sampling)

    batch = [episode(f"{i}+1?", str(i + 1)) for i in range(3)]
    ctx = context(max_new_tokens=4, reply_prefix="Score: 7\n")
    judge = judge_scheme("policy", ctx)
    ctx.engine, ctx.tokenizer = Recording(), tokenizer
    assert values(judge(batch)) == [pytest.approx(0.7)] * 3
    assert all(tokenizer.decode(ids).endswith("Score: 7\n") for ids in recorded)
    assert judge.pop_metrics() == {
        "judged": 3.0,
        "cache_hits": 0.0,
        "parse_failures": 0.0,
        "unformatted": 0.0,
        "errors": 0.0,
    }
    local = judge_scheme(str(tiny_model_dir), context(max_new_tokens=4, batch_size=2, reply_prefix="Score: 7\n"))
    assert values(local(batch)) == [pytest.approx(0.7)] * 3


def test_a_judge_reply_that_gives_no_score_is_a_counted_parse_failure(policy_engine, tokenizer):
    ctx = context(max_new_tokens=4, max_score=0.001)  # a random model's digits almost never land in [0, 0.001]
    judge = judge_scheme("policy", ctx)
    ctx.engine, ctx.tokenizer = policy_engine, tokenizer
    scores = values(judge([episode(f"{i}+1?", str(i + 1)) for i in range(4)]))
    failures = judge.pop_metrics()["parse_failures"]
    assert failures == sum(s is None for s in scores) and failures >= 3


class JudgeServer:
    """A real HTTP server speaking chat.completions: ``Score: 7`` unless the prompt says SLOW (sleeps),
    OUT (``Score: 15``) or NOSCORE (a reply with no number)."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.received.append(body)
                prompt = body["messages"][-1]["content"]
                if "SLOW" in prompt:
                    time.sleep(1.5)
                reply = (
                    "Score: 15"
                    if "OUT" in prompt
                    else "I cannot grade this."
                    if "NOSCORE" in prompt
                    else "Fine. Score: 7"
                )
                data = json.dumps(
                    {
                        "id": "x",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body["model"],
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply}}
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                ).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def server():
    judge_server = JudgeServer()
    yield judge_server
    judge_server.httpd.shutdown()


def endpoint(server, **settings) -> RewardContext:
    return context(base_url=server.url, model="grader", timeout_s=0.5, **settings)


def test_an_openai_endpoint_judges_with_the_rubric_file(server, tmp_path, monkeypatch):
    (tmp_path / "rubric.txt").write_text("Question: {question}\nGold: {answer}\nReply: {completion}\nScore it.")
    monkeypatch.setenv("JUDGE_KEY", "secret")
    judge = judge_scheme("openai", endpoint(server, rubric=str(tmp_path / "rubric.txt"), api_key_env="JUDGE_KEY"))
    server.received.clear()
    assert values(judge([episode("2+2?", "\\boxed{4}"), episode("OUT 3+3?", "6")])) == [pytest.approx(0.7), None]
    assert sorted(b["messages"][0]["content"] for b in server.received) == [
        "Question: 2+2?\nGold: 4\nReply: \\boxed{4}\nScore it.",
        "Question: OUT 3+3?\nGold: 4\nReply: 6\nScore it.",
    ]
    assert all(b["model"] == "grader" and b["temperature"] == 0.0 for b in server.received)
    assert judge.pop_metrics() == {
        "judged": 2.0,
        "cache_hits": 0.0,
        "parse_failures": 1.0,
        "unformatted": 0.0,
        "errors": 0.0,
    }


def test_an_endpoint_timeout_with_skip_leaves_the_episode_unscored_and_counts_it(server):
    judge = judge_scheme("openai", endpoint(server, on_call_error="skip"))
    with pytest.warns(
        RuntimeWarning, match="judge 'judge:openai' failed on request 1 of the batch: .*on_call_error=skip"
    ):
        scores = values(judge([episode("2+2?", "4"), episode("SLOW 3+3?", "6")]))
    assert scores == [pytest.approx(0.7), None]
    assert judge.pop_metrics() == {
        "judged": 2.0,
        "cache_hits": 0.0,
        "parse_failures": 0.0,
        "unformatted": 0.0,
        "errors": 1.0,
    }
    assert values(judge([episode("2+2?", "4")])) == [pytest.approx(0.7)]  # cached; the failure is not


def test_an_endpoint_timeout_with_fail_stops_naming_the_judge(server):
    judge = judge_scheme("openai", endpoint(server, on_call_error="fail"))
    with pytest.raises(
        RewardError, match=r"judge 'judge:openai' failed on request 0 of the batch: .*on_call_error=fail"
    ):
        judge([episode("SLOW 2+2?", "4")])


def test_resolve_rewards_builds_the_judge_with_the_runs_settings(server):
    from agentrl_math import MathEnv

    config = TrainConfig(
        rewards={"judge:openai": 0.5, "accuracy": 1.0},
        on_call_error="skip",
        plugins={"judge": {"base_url": server.url, "model": "grader"}},
    )
    resolved = resolve_rewards(config, load_plugins().registry, MathEnv())
    assert list(resolved) == ["judge", "accuracy"] and resolved["judge"][1] == 0.5
    assert values(resolved["judge"][0]([episode("2+2?", "4")])) == [pytest.approx(0.7)]
    assert "{prompt}" in DEFAULT_RUBRIC and "{completion}" in DEFAULT_RUBRIC


def test_a_local_model_folder_judges_greedily(tiny_model_dir):
    batch = [episode(f"{i}+1?", str(i + 1)) for i in range(3)]
    first = judge_scheme(str(tiny_model_dir), context(max_new_tokens=4, batch_size=2))
    second = judge_scheme(str(tiny_model_dir), context(max_new_tokens=4, batch_size=2))
    scores = values(first(batch))
    assert values(second(batch)) == scores and all(s is None or 0 <= s <= 1 for s in scores)  # greedy: the same replies
    assert first.pop_metrics() == {
        "judged": 3.0,
        "cache_hits": 0.0,
        "parse_failures": float(sum(s is None for s in scores)),
        "unformatted": float(sum(s is not None for s in scores)),
        "errors": 0.0,
    }


def test_a_model_alias_names_the_judge_folder_the_policy_would_load(tokenizer):
    """``judge:smollm2-135m`` reads the default model's converted folder, resolved by the function
    ``--model smollm2-135m`` goes through (resolved and checked here, not loaded: 135M on the CPU is slow)."""
    from pathlib import Path

    from agentrl.model.loading import DEFAULT_MODEL, resolve_model
    from agentrl.model.roles import check_folder, load_tokenizer_for_role, role_folder

    assert Path(role_folder("judge", DEFAULT_MODEL)) == Path(resolve_model(DEFAULT_MODEL))
    assert check_folder("judge", DEFAULT_MODEL).architectures == ["LlamaForCausalLM"]
    assert load_tokenizer_for_role("judge", DEFAULT_MODEL).get_vocab() == tokenizer.get_vocab()
    config = TrainConfig(rewards={"judge:smollm2-135m": 1.0})
    assert with_absolute_paths(config, load_plugins().registry) is config  # stored as the alias, not a cache path


def test_cli_trains_with_the_policy_as_its_own_judge(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    result = agentrl_in_process(
        "train",
        "--model",
        str(tiny_model_dir),
        "--reward",
        "judge:policy:0.5",
        "--reward",
        "format",
        "--set",
        "plugins.judge.max_new_tokens=4",
        "--set",
        'plugins.judge.reply_prefix="Score: 7 "',  # a score on every reply, whatever the model writes after it
        "--max-steps",
        "2",
        "--num-generations",
        "2",
        "--prompts-per-step",
        "2",
        "--set",
        "eval_tasks=3",
        "--set",
        "max_new_tokens=8",
        "--output-dir",
        str(out),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [line for line in lines if "judge/judged" in line]
    assert len(train) == 2
    before = json.loads((out / "eval.json").read_text())["before"]  # evaluation's own counts
    assert before["eval/judge/judged"] + before["eval/judge/cache_hits"] == 3.0
    for line in train:  # the held-out episodes the judge scored before step 1 are not counted in it
        assert line["judge/judged"] + line["judge/cache_hits"] == 4.0
        assert 0 <= line["judge/parse_failures"] <= 4.0 and line["judge/errors"] == 0.0
    # Every episode keeps the judge's prompt and raw reply, scored as its reward component.
    for store, count in (("completions.jsonl", 8), ("eval_completions.jsonl", 6)):
        episodes = [json.loads(line) for line in (out / store).read_text().splitlines()]
        assert len(episodes) == count
        for episode in episodes:
            [judgement] = episode["judgements"]
            user = [m for m in episode["messages"] if m["role"] == "user"][-1]["content"]
            reply = [m for m in episode["messages"] if m["source"] == "sampled"][-1]["content"]
            answer = episode["task"].get("answer", "")
            assert judgement["reward"] == "judge" and judgement["prompt"] == DEFAULT_RUBRIC.format(
                prompt=user, completion=reply, reference=answer
            )
            assert judgement["reply"].startswith("Score: 7 ") and judgement["score"] == parse_score(judgement["reply"])
            assert judgement["score"] == episode["rewards"]["judge"] == 0.7


class StallingServer:
    """A real HTTP server that never finishes a reply: ``trickle`` sends the status line and headers,
    then one byte of a 100 kB body every ``every`` seconds (each byte resets an HTTP client's read
    timeout); ``silent`` reads the request and never answers. Counts the bytes it trickled."""

    def __init__(self, mode: str, every: float = 0.5) -> None:
        self.mode, self.sent = mode, 0
        self.stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers["Content-Length"]))
                if mode == "silent":
                    server.stop.wait(120)
                    return
                try:
                    self.wfile.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                    )
                    self.wfile.flush()
                    while not server.stop.wait(every):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        server.sent += 1
                except (BrokenPipeError, ConnectionResetError):  # the client gave up: the deadline worked
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()


@pytest.fixture(params=["trickle", "silent"])
def stalling(request):
    stalling_server = StallingServer(request.param)
    yield stalling_server
    stalling_server.close()


def test_a_stalling_endpoint_is_cut_at_the_deadline_whatever_it_sends(stalling):
    """A server trickling a byte every 0.5 s never trips a 2 s read timeout; the whole-request deadline
    (timeout_s) ends both requests, running at once, in about 2 s, each counted as an error."""
    judge = judge_scheme("openai", context(base_url=stalling.url, model="grader", timeout_s=2.0, on_call_error="skip"))
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match=r"no complete reply from .* within plugins.judge.timeout_s=2 s"):
        scores = values(judge([episode("2+2?", "4"), episode("3+3?", "6")]))
    elapsed = time.monotonic() - start
    assert scores == [None, None] and 1.9 < elapsed < 6.0, elapsed
    assert judge.pop_metrics()["errors"] == 2.0
    time.sleep(1.2)
    sent = stalling.sent
    time.sleep(1.2)
    assert stalling.sent == sent  # the requests were cancelled: their connections are closed, nothing trickles on
    assert sent >= 2 if stalling.mode == "trickle" else sent == 0  # it did trickle, within the deadline


SCORE_THEN_EXIT = """
import time, warnings
warnings.simplefilter("ignore")
from agentrl.config.train import TrainConfig
from agentrl.env import CallGuard
from agentrl.plugins import load_plugins
from agentrl.rewards.scoring import score
from agentrl.rewards.specs import resolve_rewards
from agentrl.testing import make_trajectory
from agentrl_math import MathEnv

config = TrainConfig(
    rewards={{"judge:openai": 1.0}},
    plugins={{"judge": {{"base_url": {url!r}, "model": "grader", "timeout_s": 2.0}}}},
)
fns = resolve_rewards(config, load_plugins().registry, MathEnv())
episodes = [
    make_trajectory([{{"role": "user", "content": f"{{i}}+1?"}}, {{"role": "assistant", "content": "2"}}], {{"answer": "2"}})
    for i in range(3)
]
start = time.monotonic()
totals, parts = score(episodes, fns, 1.0, guard=CallGuard.from_config(config))
print(f"scored in {{time.monotonic() - start:.1f}} s: judge {{parts['judge'].tolist()}}", flush=True)
"""


def test_a_process_whose_judge_server_stalls_scores_and_exits(stalling, tmp_path):
    """End to end through the real plugin and the scorer, in a process of its own: the judge's
    requests end at their deadline and the interpreter exits at once after (no thread is joined)."""
    script = tmp_path / "score_then_exit.py"
    script.write_text(SCORE_THEN_EXIT.format(url=stalling.url))
    start = time.monotonic()
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("scored in ") and line.endswith("judge [nan, nan, nan]"), line
    assert float(line.split()[2]) < 6.0
    assert time.monotonic() - start < 60  # imports included; a joined thread would hang for the server's 120 s


def test_cli_run_with_a_trickling_judge_server_finishes_and_exits(tiny_model_dir, tmp_path):
    """``agentrl train`` whose judge endpoint trickles forever: each step's judge requests end at the
    deadline, the run saves, and the process exits."""
    trickle = StallingServer("trickle")
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "agentrl.cli.app",
                "train",
                "--model",
                str(tiny_model_dir),
                "--reward",
                "judge:openai:0.5",
                "--reward",
                "format",
                "--set",
                f"plugins.judge.base_url={trickle.url}",
                "--set",
                "plugins.judge.model=grader",
                "--set",
                "plugins.judge.timeout_s=1.5",
                "--max-steps",
                "2",
                "--num-generations",
                "2",
                "--prompts-per-step",
                "2",
                "--set",
                "eval_tasks=0",
                "--set",
                "max_new_tokens=8",
                "--output-dir",
                str(tmp_path / "run"),
            ],
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        trickle.close()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "run saved to" in result.stdout and trickle.sent >= 2
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["judge/errors"] for line in lines if "judge/errors" in line] == [4.0, 4.0]


def test_a_judge_whose_replies_never_parse_says_so_and_stops_a_run_it_alone_scores(server, tmp_path):
    """Every reply unparsed: the first such call warns naming the judge, the replies and one of them;
    when the judge is the run's only reward, max_nonfinite_steps such calls in a row stop the run with
    that line instead of a generic non-finite-loss one. Beside another reward it only warns."""
    (tmp_path / "rubric.txt").write_text("NOSCORE {prompt} {completion}")
    settings = dict(base_url=server.url, model="grader", rubric=str(tmp_path / "rubric.txt"))
    batch = [episode(f"{i}+1?", str(i + 1)) for i in range(4)]
    only = TrainConfig(rewards={"judge:openai": 1.0}, env_reward_weight=0.0, max_nonfinite_steps=2)
    judge = judge_scheme("openai", RewardContext(config=only, settings={"judge": JudgeConfig(**settings)}))
    with pytest.warns(RuntimeWarning, match=re.escape("judge:openai: 0 of 4 replies parsed (first: 'I cannot grade")):
        assert values(judge(batch)) == [None] * 4
    with pytest.raises(
        RewardError,
        match=re.escape(
            "judge:openai: 0 of 8 replies parsed in the last 2 calls (first: 'I cannot grade this.'); a reply needs "
            "'Score: N' or a last number N in [0, 10]. The judge is the run's only reward (env_reward_weight=0)"
        ),
    ):
        judge([episode(f"{i}+2?", str(i + 2)) for i in range(4)])
    beside = TrainConfig(rewards={"judge:openai": 1.0, "format": 1.0}, env_reward_weight=0.0, max_nonfinite_steps=2)
    judge = judge_scheme("openai", RewardContext(config=beside, settings={"judge": JudgeConfig(**settings)}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for start in range(0, 12, 4):
            assert values(judge([episode(f"{i}*3?", str(i * 3)) for i in range(start, start + 4)])) == [None] * 4
    said = [str(w.message)[:40] for w in caught if not issubclass(w.category, ResourceWarning)]  # GC of others' sockets
    assert said == ["judge:openai: 0 of 4 replies parsed (fir"]  # once per streak
    assert judge.pop_metrics()["parse_failures"] == 12.0


def test_cli_judge_only_run_whose_replies_never_parse_names_the_judge(server, tiny_model_dir, tmp_path):
    (tmp_path / "rubric.txt").write_text("NOSCORE {prompt} {completion}")
    result = agentrl_in_process(
        "train",
        "--model",
        str(tiny_model_dir),
        "--reward",
        "judge:openai",
        "--set",
        "env_reward_weight=0",
        "--set",
        f"plugins.judge.base_url={server.url}",
        "--set",
        "plugins.judge.model=grader",
        "--set",
        f"plugins.judge.rubric={tmp_path / 'rubric.txt'}",
        "--max-steps",
        "5",
        "--num-generations",
        "2",
        "--prompts-per-step",
        "2",
        "--set",
        "eval_tasks=0",
        "--set",
        "max_new_tokens=8",
        "--output-dir",
        str(tmp_path / "run"),
    )
    err = " ".join(result.stderr.split())
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        "error: judge:openai: 0 of" in err
        and "replies parsed in the last 3 calls (first: 'I cannot grade this.')" in err
    )
    assert "The judge is the run's only reward (env_reward_weight=0), so no episode was scored" in err
    assert "non-finite loss" not in err and "Traceback" not in result.stderr


def test_a_sequence_classification_folder_is_no_judge(tmp_path, tokenizer):
    """judge:PATH on a reward model's folder is refused, not loaded as a causal LM with a new head
    whose replies would never parse."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=1,
        tie_word_embeddings=True,  # its LM head would be the embeddings: no key missing, still no LM
        pad_token_id=2,
    )
    LlamaForSequenceClassification(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"judge: {tmp_path} is a sequence-classification model (LlamaForSequenceClassification), not a causal "
            "LM: judge:PATH takes a causal LM folder"
        ),
    ):
        judge_scheme(str(tmp_path), context())
