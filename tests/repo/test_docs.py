"""Every snippet in docs/**/*.md and README.md runs, and docs/hooks.md is generated from the hookspecs.

Fenced blocks, by language:

* ``python``: executed, each in a fresh module. A block whose first line is ``# file: NAME.py``
  is also written to the document's scratch directory before any of its blocks run, so later
  blocks can import it and bash blocks can name it (``--env sort_env.py:SortEnv``). Whatever a
  block defines is then exercised: Env subclasses pass ``agentrl.testing.check_env``, reward
  functions (agentrl- or TRL-style) return one finite float or None per episode on sample
  episodes, algorithms build with their default config, and a ``# file:`` block with hook
  implementations registers as a plugin, what it registers checked the same way.
* ``bash``: each command runs in the scratch directory: ``agentrl ...`` in-process through the
  CLI, ``pytest``/``python`` in a subprocess, ``cd``. Unmarked, only cheap ``agentrl`` commands are
  allowed (``plugins``, ``new``, ``train ... --print-config``): anything that would load or train
  the default model must be marked. A ``text`` block right after a bash block is
  the expected output of its last command (each line, in order; ``error:`` means exit status 2).
* ``yaml``: a config file ``build_config`` accepts, its rewards resolvable; ``toml``: an
  ``agentrl`` entry-point table.

A bash block is skipped only by the marker ``docs-test: skip (REASON)``, as its first line
(``# docs-test: skip (...)``) or an HTML comment on the line before the fence; a reason that
names a test file that runs the command instead (``tests/plugins/test_judge.py starts one``) must
name one that exists. The marker
``docs-test: tiny`` runs each ``agentrl train`` of the block for 2 steps on a tiny random model
(the flags appended below, each run in a folder of its own) instead of the default model.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import os
import re
import shlex
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

import agentrl
from agentrl import hookspecs
from agentrl.cli import hookdoc
from agentrl.rewards.specs import TRLReward, reward_style
from agentrl.testing import check_env, check_reward_output, make_trajectory

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SOURCES = [*sorted(DOCS.rglob("*.md")), ROOT / "README.md", ROOT / "CHANGELOG.md"]
GUIDES = (
    "guides/rewards.md",
    "guides/envs.md",
    "guides/tool-envs.md",
    "guides/agents.md",
    "guides/algorithms.md",
    "guides/plugins.md",
    "hooks.md",
    "reference/config.md",
    "concepts/guards.md",
)

_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_MARKER = re.compile(r"^\s*(?:#|<!--)\s*docs-test:\s*(\w+)\s*(?:\((.*?)\))?")
_FILE = re.compile(r"^# file: ([\w./-]+\.py)\s*$")
TINY_FLAGS = [
    "--max-steps",
    "2",
    "--prompts-per-step",
    "2",
    "--num-generations",
    "2",
    "--set",
    "eval_tasks=0",
    "--set",
    "max_new_tokens=8",
    "--set",
    "save_model=false",
    "--set",
    "log_completions_every=0",
]
"""Appended to each ``agentrl train`` of a ``docs-test: tiny`` block (with ``--model`` and ``--output-dir``)."""


@dataclass
class Block:
    """One fenced block of a Markdown file."""

    source: Path
    line: int
    lang: str
    code: str
    marker: str | None = None
    reason: str = ""
    expected: str | None = None

    @property
    def id(self) -> str:
        return f"{self.source.relative_to(ROOT)}:{self.line}"

    @property
    def filename(self) -> str | None:
        match = _FILE.match(self.code.splitlines()[0]) if self.code.strip() else None
        return match.group(1) if match else None


def parse(source: Path) -> list[Block]:
    """The fenced blocks of ``source``; a ``text`` block right after a bash block becomes its
    ``expected`` output instead of a block of its own."""
    text = source.read_text()
    blocks: list[Block] = []
    previous_end = None
    for match in _FENCE.finditer(text):
        lang, code = match.group(1), match.group(2)
        before = text[: match.start()]
        if lang == "text" and blocks and blocks[-1].lang == "bash" and not text[previous_end : match.start()].strip():
            blocks[-1].expected = code
            previous_end = match.end()
            continue
        block = Block(source, before.count("\n") + 1, lang, code)
        lines_before = [line for line in before.splitlines() if line.strip()]
        for candidate in (code.splitlines()[0] if code.strip() else "", lines_before[-1] if lines_before else ""):
            marker = _MARKER.match(candidate)
            if marker:
                block.marker, block.reason = marker.group(1), (marker.group(2) or "").strip()
                break
        blocks.append(block)
        previous_end = match.end()
    return blocks


BLOCKS = [block for source in SOURCES for block in parse(source)]


def blocks(lang: str) -> list:
    return [pytest.param(b, id=b.id) for b in BLOCKS if b.lang == lang]


# -- the hook reference ------------------------------------------------------------------------------


def test_hooks_md_is_generated_from_the_hookspecs():
    assert (DOCS / "hooks.md").read_text() == hookdoc.render(), (
        "docs/hooks.md differs from agentrl/hookspecs.py: run `python -m agentrl.cli.hookdoc`"
    )


def test_hook_reference_covers_every_hook_with_signature_and_firstresult():
    text = hookdoc.render()
    names = sorted(n for n in vars(hookspecs) if n.startswith("agentrl_") and callable(getattr(hookspecs, n)))
    assert sorted(re.findall(r"^### (agentrl_\w+)$", text, flags=re.M)) == names
    assert "`agentrl_importance_weights(log_ratio: torch.Tensor, loss_mask: torch.Tensor, level: str," in text
    rows = dict(re.findall(r"^\| \[`(agentrl_\w+)`\]\(#\w+\) \| \w+ \| (yes|no) \|", text, flags=re.M))
    assert rows == {n: "yes" if getattr(hookspecs, n).agentrl_spec["firstresult"] else "no" for n in names}
    assert "``" not in text and ":class:" not in text  # reST markup converted


def test_hookdoc_writes_and_checks(tmp_path, capsys):
    path = tmp_path / "hooks.md"
    assert hookdoc.main(["--output", str(path), "--check"]) == 1
    assert "is out of date with agentrl/hookspecs.py: run `python -m agentrl.cli.hookdoc`" in capsys.readouterr().err
    assert hookdoc.main(["--output", str(path)]) == 0 and path.read_text() == hookdoc.render()
    assert hookdoc.main(["--output", str(path), "--check"]) == 0
    path.write_text(path.read_text().replace("Register environments", "Register envs"))
    assert hookdoc.main(["--output", str(path), "--check"]) == 1


@pytest.fixture(scope="module")
def builtins():
    """agentrl's own plugins, found independently of hookdoc: the ``agentrl`` distribution's entry
    points, loaded; plugin name -> PluginInfo."""
    from importlib.metadata import entry_points

    from agentrl.plugins import load_plugins

    ours = {ep.name for ep in entry_points(group="agentrl") if ep.dist is not None and ep.dist.name == "agentrl"}
    assert {"grpo", "gspo", "ppo", "math_env", "verifiers_env"} <= ours
    plugins = load_plugins().plugins
    return {name: plugins[name] for name in sorted(ours)}


def test_hookspec_docstrings_list_no_builtin_plugins_by_hand():
    hand_lists = [fn.__name__ for fn in hookdoc.hook_functions() if re.search(r"Built-ins?:", inspect.getdoc(fn))]
    assert not hand_lists, f"{hand_lists}: hookdoc generates the built-in plugins of each hook"


def test_hook_reference_names_every_builtin_plugin_and_what_it_registers(builtins):
    text = hookdoc.render()
    for name, info in builtins.items():
        assert f"| `{name}` | `{info.module}` |" in text, f"built-in plugin {name} missing from hooks.md's table"
        for kind, names in info.registered.items():
            hook = next(
                h.__name__
                for h in hookdoc.hook_functions()
                if hookdoc.registered_kind(h.__name__) == kind and h.__name__.startswith("agentrl_register_")
            )
            section = text.split(f"### {hook}\n", 1)[1].split("\n### ", 1)[0]
            line = next(line for line in section.splitlines() if line.startswith("Built-in: "))
            assert f"`{info.module}` ({', '.join(names)})" in line, (hook, line)
    sampler = text.split("### agentrl_per_token_loss_factors\n", 1)[1].split("\n### ", 1)[0]
    assert "Built-in implementations: `agentrl_sampler_correction`." in sampler


def test_hook_reference_ignores_plugins_not_shipped_with_agentrl(tmp_path, monkeypatch):
    dist = tmp_path / "agentrl_env_third-0.1.dist-info"  # an installed third-party plugin package
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: agentrl-env-third\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[agentrl]\nthird_env = agentrl_env_third\n")
    (tmp_path / "agentrl_env_third.py").write_text(
        "from agentrl import hookimpl\n\n\n@hookimpl\ndef agentrl_register_envs(register):\n"
        "    register('third', object)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from agentrl.plugins import load_plugins

    assert "third_env" in load_plugins().plugins
    manager = hookdoc.builtin_plugins()
    assert "third_env" not in manager.plugins and {"agentrl.defaults", "grpo", "math_env"} <= set(manager.plugins)
    assert "third" not in hookdoc.render(manager=manager)


_BUILTINS_MARKER = re.compile(r"<!--\s*builtins:\s*([\w, ]+?)\s*-->")


def test_doc_lists_of_builtin_plugins_name_every_one(builtins):
    """A paragraph (or list item) marked ``<!-- builtins: KIND[, KIND] -->`` (``all``: every kind)
    claims to list agentrl's built-in plugins of those kinds: it must name each one's module."""
    found = 0
    for source in SOURCES:
        text = source.read_text()
        for match in _BUILTINS_MARKER.finditer(text):
            found += 1
            start = max(text.rfind("\n\n", 0, match.start()), text.rfind("\n- ", 0, match.start()))
            ends = [i for i in (text.find("\n\n", match.end()), text.find("\n- ", match.end())) if i >= 0]
            paragraph = text[start : min(ends, default=len(text))]
            kinds = {kind.strip() for kind in match.group(1).split(",")}
            wanted = sorted(info.module for info in builtins.values() if "all" in kinds or kinds & set(info.registered))
            missing = [module for module in wanted if not re.search(rf"\b{module}\b", paragraph)]
            assert wanted and not missing, f"{source.name}: the list marked {match.group(0)} misses {missing}"
    assert found, "no <!-- builtins: KIND --> list in the docs: this check would check nothing"


# -- the documents ------------------------------------------------------------------------------------


def test_guides_exist_and_their_relative_links_resolve():
    assert {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")} >= set(GUIDES)
    for source in SOURCES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", source.read_text()):
            if not re.match(r"\w+://", target):
                assert (source.parent / target).exists(), (
                    f"{source.relative_to(ROOT)}: link to {target} does not resolve"
                )


def test_markers_are_known_and_skips_give_a_reason():
    for block in BLOCKS:
        if block.marker is not None:
            assert block.marker in ("skip", "tiny"), f"{block.id}: unknown marker docs-test: {block.marker}"
            allowed = ("bash", "python") if block.marker == "tiny" else ("bash",)
            assert block.lang in allowed, (
                f"{block.id}: docs-test {block.marker} applies to {' and '.join(allowed)} blocks"
            )
            assert block.marker != "skip" or block.reason, f"{block.id}: say why: docs-test: skip (REASON)"
            for cited in re.findall(r"\btests/[\w/]+\.py", block.reason):  # a test said to run it instead
                assert (ROOT / cited).is_file(), f"{block.id}: the skip reason cites {cited}, which does not exist"


@pytest.fixture(scope="session")
def workdirs(tmp_path_factory):
    """A scratch directory per document, holding every ``# file:`` block of it."""
    made: dict[Path, Path] = {}

    def workdir(source: Path) -> Path:
        if source not in made:
            folder = tmp_path_factory.mktemp(source.stem)
            for block in parse(source):
                if block.lang == "python" and block.filename:
                    (folder / block.filename).write_text(block.code)
            made[source] = folder
        return made[source]

    return workdir


@contextlib.contextmanager
def inside(folder: Path):
    """``folder`` as the working directory and first on sys.path; modules imported from it are
    forgotten afterwards, so every block imports the document's files afresh."""
    cwd, path = Path.cwd(), list(sys.path)
    os.chdir(folder)
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        os.chdir(cwd)
        sys.path[:] = path
        for name, module in list(sys.modules.items()):
            file = getattr(module, "__file__", None) or ""
            if name.startswith("docs_block_") or (file and Path(file).is_relative_to(folder)):
                del sys.modules[name]


def sample_episodes(columns: dict | None = None) -> list:
    """Episodes a reward must score without error: right, wrong, multi-turn with a tool, no reply
    (their task has ``columns`` too: the dataset columns a TRL-style function asks for)."""
    task = {"question": "What is 2 + 3?", "answer": "5", **(columns or {})}
    user = {"role": "user", "content": task["question"]}
    return [
        make_trajectory([user, {"role": "assistant", "content": "The answer is \\boxed{5}."}], task),
        make_trajectory([user, {"role": "assistant", "content": "It is 4."}], task),
        make_trajectory(
            [
                {"role": "system", "content": "Use tools."},
                user,
                {"role": "assistant", "content": agentrl.format_tool_call("add", a=2, b=3)},
                {"role": "tool", "name": "add", "content": "5"},
                {"role": "assistant", "content": "\\boxed{5}"},
            ],
            task,
        ),
        make_trajectory([user], task),
    ]


def check_reward_function(fn, name: str) -> None:
    """One finite float or None per sample episode, through the adapter the trainer uses."""
    if reward_style(fn, name) == "agentrl":
        check_reward_output(fn, sample_episodes())
        return
    errors = []
    standard = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric"}
    columns = {
        p.name: "sample"
        for p in inspect.signature(fn).parameters.values()
        if p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty and p.name not in standard
    }
    for completion_format in ("conversational", "plain"):  # TRL-style: one of them must fit
        try:
            check_reward_output(TRLReward(fn, name, completion_format), sample_episodes(columns))
            return
        except agentrl.RewardError as error:
            errors.append(f"{completion_format}: {error}")
    raise AssertionError(f"reward {name} fails on sample episodes: {errors}")


def exercise(module: types.ModuleType, block: Block) -> None:
    """Check what a block defines (see the module docstring)."""
    checked: set[int] = set()
    for name, value in vars(module).items():
        if getattr(value, "__module__", None) != module.__name__:
            continue
        if isinstance(value, type) and issubclass(value, agentrl.Env) and not inspect.isabstract(value):
            check_env(value)
            checked.add(id(value))
        elif isinstance(value, type) and issubclass(value, agentrl.Algorithm) and not inspect.isabstract(value):
            value(value.config_class())
        elif (
            inspect.isfunction(value)
            and not name.startswith("agentrl_")
            and {"trajectories", "completions"} & set(inspect.signature(value).parameters)
        ):
            check_reward_function(value, name)
            checked.add(id(value))
    if block.filename and any(hasattr(v, "agentrl_impl") for v in vars(module).values()):
        manager = agentrl.PluginManager()
        manager.register_plugin(module, name=block.filename)
        for component in manager.registry.components():
            factory = component.factory
            if id(factory) in checked:
                continue
            if component.kind == "env":
                check_env(factory)
            elif component.kind == "reward":
                check_reward_function(factory, component.name)
            elif component.kind == "algorithm":
                factory(factory.config_class())
            elif component.kind == "settings":
                factory()


def tiny_api(monkeypatch, tiny_model: Path, folder: Path, block: Block) -> list[Path]:
    """Make each run a ``docs-test: tiny`` python block starts through the Python API (``agentrl.train``,
    ``agentrl.Trainer``) run as :data:`TINY_FLAGS` say, on ``tiny_model``, in a folder of its own;
    the run dirs, as they are made."""
    from agentrl.api import trainer as api

    made: list[Path] = []
    original = api.Trainer.__init__
    tiny = {"max_steps": 2, "prompts_per_step": 2, "num_generations": 2, "eval_tasks": 0, "max_new_tokens": 8}
    tiny |= {"save_model": False, "log_completions_every": 0, "verbose": False}

    def small(self, config=None, /, **kwargs):
        made.append(folder / f"run-{block.line}-{len(made)}")
        kwargs |= {**tiny, "model": str(tiny_model), "output_dir": str(made[-1])}
        original(self, config, **kwargs)

    monkeypatch.setattr(api.Trainer, "__init__", small)
    return made


@pytest.mark.parametrize("block", blocks("python"))
def test_python_block_runs(block, workdirs, request, monkeypatch):
    folder = workdirs(block.source)
    runs = (
        tiny_api(monkeypatch, request.getfixturevalue("tiny_model_dir"), folder, block)
        if block.marker == "tiny"
        else []
    )
    with inside(folder):
        if block.filename:  # imported from its file, as `--env file.py:Class` or `import` would
            spec = importlib.util.spec_from_file_location(Path(block.filename).stem, folder / block.filename)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module.__name__] = module  # dataclasses look their module up
            spec.loader.exec_module(module)
        else:  # compiled with the document's line numbers, so a traceback points into the .md
            name = re.sub(r"\W", "_", f"{block.source.relative_to(ROOT).with_suffix('')}_{block.line}")
            module = types.ModuleType(f"docs_block_{name}")
            sys.modules[module.__name__] = module
            exec(compile("\n" * block.line + block.code, str(block.source), "exec"), module.__dict__)
        exercise(module, block)
    if block.marker == "tiny":
        assert runs and all((run / "metrics.jsonl").is_file() for run in runs), f"{block.id}: no run trained: {runs}"


# -- bash ---------------------------------------------------------------------------------------------


def commands(code: str) -> list[list[str]]:
    """Each command of a shell block as argv: continuation lines joined, comments dropped, ``&&``
    chains split."""
    out: list[list[str]] = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            out.append(words[:cut])
            words = words[cut + 1 :]
    return [argv for argv in out if argv]


def tiny_run_dir(cwd: Path, block: Block, index: int) -> Path:
    """Where the ``index``-th command of a ``docs-test: tiny`` block saves its run (one each)."""
    return cwd / f"run-{block.line}-{index}"


def run_command(argv: list[str], cwd: Path, block: Block, tiny_model: Path | None, index: int = 0) -> tuple[int, str]:
    """(exit status, output) of one documented command, the ``index``-th of its block."""
    program, args = argv[0], argv[1:]
    cheap = args[:1] in (["plugins"], ["new"]) or (args[:1] == ["train"] and "--print-config" in args)
    if program == "agentrl" and not cheap and not (block.marker == "tiny" and args[:1] == ["train"]):
        raise AssertionError(
            f"{block.id}: `{' '.join(argv)}` would load or train the default model; mark the "
            "block `# docs-test: tiny` (2 steps on a tiny model) or `# docs-test: skip (REASON)`"
        )
    if program == "agentrl":
        from typer.testing import CliRunner

        from agentrl.cli.app import app

        if block.marker == "tiny" and args[:1] == ["train"]:
            args = [
                *args,
                "--model",
                str(tiny_model),
                *TINY_FLAGS,
                "--output-dir",
                str(tiny_run_dir(cwd, block, index)),
            ]
        previous = Path.cwd()
        os.chdir(cwd)
        try:
            result = CliRunner().invoke(app, args)
        finally:
            os.chdir(previous)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result.exit_code, result.output
    if program in ("pytest", "python"):
        command = (
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
            if program == "pytest"
            else [sys.executable, *args]
        )
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        return done.returncode, done.stdout + done.stderr
    raise AssertionError(
        f"{block.id}: tests/repo/test_docs.py cannot run `{' '.join(argv)}`; make the block cheap "
        "or mark it `# docs-test: skip (REASON)` (or `<!-- docs-test: skip (REASON) -->` before it)"
    )


def expect(output: str, expected: str, where: str) -> None:
    """Each non-empty line of ``expected`` occurs in ``output``, in order (whitespace-normalised)."""
    flat = " ".join(output.split())
    position = 0
    for line in expected.splitlines():
        wanted = " ".join(line.split())
        if not wanted:
            continue
        found = flat.find(wanted, position)
        assert found >= 0, f"{where}: expected output line {wanted!r} not found in order in:\n{output}"
        position = found + len(wanted)


@pytest.mark.parametrize("block", blocks("bash"))
def test_bash_block_runs(block, workdirs, request):
    if block.marker == "skip":
        pytest.skip(f"docs-test: skip ({block.reason})")
    tiny_model = request.getfixturevalue("tiny_model_dir") if block.marker == "tiny" else None
    cwd = workdirs(block.source)
    argvs = commands(block.code)
    assert argvs, f"{block.id}: empty bash block"
    for i, argv in enumerate(argvs):
        if argv[0] == "cd":
            cwd = (cwd / argv[1]).resolve()
            continue
        status, output = run_command(argv, cwd, block, tiny_model, i)
        last = i == len(argvs) - 1
        wanted = 2 if last and block.expected is not None and block.expected.lstrip().startswith("error:") else 0
        assert status == wanted, f"{block.id}: `{' '.join(argv)}` exited {status}, expected {wanted}:\n{output}"
        if block.marker == "tiny" and argv[1:2] == ["train"]:
            assert "run saved to" in output and (tiny_run_dir(cwd, block, i) / "metrics.jsonl").is_file(), output
        if last and block.expected is not None:
            expect(output, block.expected, block.id)


# -- config and packaging snippets -------------------------------------------------------------------


@pytest.mark.parametrize("block", blocks("yaml"))
def test_yaml_block_is_a_valid_run_config(block, workdirs):
    from agentrl.config.train import build_config
    from agentrl.plugins import load_plugins
    from agentrl.rewards.specs import resolve_rewards
    from agentrl.training.build import make_env

    folder = workdirs(block.source)
    (folder / f"config-{block.line}.yaml").write_text(block.code)
    with inside(folder):
        config = build_config(folder / f"config-{block.line}.yaml")
        if config.rewards:
            manager = load_plugins()
            assert resolve_rewards(config, manager.registry, make_env(manager, config))


@pytest.mark.parametrize("block", blocks("toml"))
def test_toml_block_declares_agentrl_entry_points(block):
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    data = tomllib.loads(block.code)
    entry_points = data["project"]["entry-points"]["agentrl"]
    assert entry_points and all(re.fullmatch(r"[\w.]+(:\w+)?", value) for value in entry_points.values())
