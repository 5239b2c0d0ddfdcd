"""Helpers of the live-server tests: tiny model directories, a server process tree, HTTP calls.

Everything here is standard library (plus ``tokenizers``/``transformers`` for the tokenizer the
bench_serving run needs). A :class:`LiveServer` runs its command in a new session, so the whole
process tree (tokenizer manager, schedulers, detokenizer) can be signalled and is always killed
by :meth:`LiveServer.kill_tree`, which the fixtures call in their teardown.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal as _signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

STUBS_DIR = Path(__file__).with_name("stubs")
REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
START_TIMEOUT_S = float(os.environ.get("KVTRACE_LIVE_START_TIMEOUT_S", "300"))
VOCAB = 512
SPECIAL = ("<unk>", "<s>", "</s>", "<pad>")

# Common to every server of these tests (see ../shared/notes/sglang-server-on-cpu.md).
BASE_FLAGS = (
    "--load-format", "dummy", "--device", "cpu", "--attention-backend", "torch_native",
    "--sampling-backend", "pytorch", "--dtype", "float32", "--host", "127.0.0.1",
    "--max-total-tokens", "2048", "--max-running-requests", "8", "--chunked-prefill-size", "512",
    "--max-prefill-tokens", "512", "--grammar-backend", "none", "--disable-overlap-schedule",
    "--skip-server-warmup", "--random-seed", "0",
)
# HiCache on CPU: runs with the host-copy no-ops of the stubs (KVTRACE_LIVE_HOST_NOOPS=1).
HICACHE_FLAGS = ("--enable-hierarchical-cache", "--hicache-io-backend", "direct",
                 "--hicache-mem-layout", "layer_first")


# ------------------------------------------------------------------ model directories
def write_llama(model_dir: Path) -> Path:
    """A 2-layer LlamaForCausalLM config (hidden 64, vocab 512, float32) and its tokenizer."""
    model_dir.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": VOCAB,
        "max_position_embeddings": 2048, "torch_dtype": "float32", "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
        "tie_word_embeddings": False,
    }
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    write_tokenizer(model_dir)
    return model_dir


def write_mellum_swa(model_dir: Path, *, sliding_window_tokens: int = 32) -> Path:
    """A hybrid-SWA MellumForCausalLM config: 4 dense layers alternating sliding/full attention."""
    return _write_hybrid_swa(model_dir, "MellumForCausalLM", "mellum", sliding_window_tokens, {})


def write_laguna(model_dir: Path, *, sliding_window_tokens: int = 32) -> Path:
    """The DeepSeek-V4 fork's tiny hybrid-SWA LagunaForCausalLM (its ``configs/laguna.py``): the
    same 4 dense layers, with the ids and shared-expert size Laguna's config reads."""
    return _write_hybrid_swa(model_dir, "LagunaForCausalLM", "laguna", sliding_window_tokens,
                             {"pad_token_id": 3, "shared_expert_intermediate_size": 32})


def _write_hybrid_swa(model_dir: Path, arch: str, model_type: str, window: int, extra: dict) -> Path:
    model_dir.mkdir(parents=True, exist_ok=True)
    layer_types = ["sliding_attention", "full_attention"] * 2
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    cfg = {
        "architectures": [arch], "model_type": model_type, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": VOCAB,
        "max_position_embeddings": 2048, "torch_dtype": "float32", "rms_norm_eps": 1e-5,
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "tie_word_embeddings": False,
        "layer_types": layer_types, "sliding_window": window,
        "mlp_layer_types": ["dense"] * 4, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "rope_parameters": {"full_attention": rope, "sliding_attention": rope},
        **extra,
    }
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    write_tokenizer(model_dir)
    return model_dir


def write_tokenizer(model_dir: Path) -> None:
    """A WordLevel tokenizer with exactly the model's ids: 4 specials, then words ``w4``..``w511``.

    Whitespace pre-tokenizer, so decode then encode gives back the same ids (bench_serving turns
    random ids into text and the server tokenizes it again).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL), VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>")
    fast.model_max_length = 2048
    fast.save_pretrained(str(model_dir))


# ------------------------------------------------------------------ processes
def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(offsets: tuple[int, ...] = (0,), low: int = 10_000, high: int = 21_999) -> int:
    """A port ``p`` with ``p + k`` free for every ``k`` in ``offsets``, for a server that binds it later.

    The ports lie below the kernel's ephemeral range: ``bind(("", 0))`` and every outgoing
    ``connect()`` draw from that range, so a port picked there and bound by a child seconds later
    can be taken in between (the fork's scheduler then fails its TCPStore with EADDRINUSE). They
    also lie below sglang 0.5.23's own pick for its nccl port (22000-29999), so two servers of
    one test run cannot be handed the same one."""
    import random

    candidates = range(low, min(high, _ephemeral_low() - 1) - max(offsets) + 1)
    if not candidates and offsets == (0,):  # a machine whose ephemeral range starts below ``low``:
        with socket.socket() as s:  # the kernel's pick (racy, as before; nothing else is left)
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    for port in random.Random().sample(candidates, min(256, len(candidates))):
        try:
            for k in offsets:
                with socket.socket() as s:
                    s.bind(("0.0.0.0", port + k))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no free port in {low}-{high} below the ephemeral range with offsets {offsets}")


def stub_env(extra: dict | None = None) -> dict:
    """Environment for a server or client process: CPU engine, the import stubs on PYTHONPATH."""
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("KVTRACE_"):
            env.pop(k)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env["PYTHONPATH"] = str(STUBS_DIR) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PATH"] = str(VENV_BIN) + os.pathsep + env.get("PATH", "")
    env.update(extra or {})
    return env


class LiveServer:
    """A server command run in its own session (process group), with its output in ``log``."""

    def __init__(self, argv: list[str], env: dict, port: int, log: Path) -> None:
        self.argv, self.env, self.port, self.log = argv, env, port, log
        self.proc: subprocess.Popen | None = None
        self.start_s = None

    def start(self) -> "LiveServer":
        t0 = time.monotonic()
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=f, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO)
        deadline = t0 + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before /health; "
                                   f"log {self.log}:\n{self.tail()}")
            try:
                if get(self.port, "/health", timeout_s=5)[0] == 200:
                    self.start_s = time.monotonic() - t0
                    return self
            except OSError:
                pass
            time.sleep(1.0)
        self.kill_tree()
        raise TimeoutError(f"server not healthy after {START_TIMEOUT_S:.0f} s; log {self.log}:\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the server's PID (the command we started)."""
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout=timeout_s)

    def kill_group(self, sig: int = _signal.SIGKILL) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill_tree(self) -> None:
        """SIGKILL every process of the server's session; never raises (fixture teardown)."""
        if self.proc is None:
            return
        self.kill_group(_signal.SIGKILL)
        try:
            self.proc.wait(timeout=30)
        except Exception:
            pass


# ------------------------------------------------------------------ HTTP (127.0.0.1 only)
def _request(port: int, path: str, body=None, timeout_s: float = 60.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"},
                                 method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def get(port: int, path: str, timeout_s: float = 30.0):
    return _request(port, path, None, timeout_s)


def post(port: int, path: str, body: dict, timeout_s: float = 60.0):
    return _request(port, path, body, timeout_s)


def generate(port: int, input_ids: list[int], max_new_tokens: int, *, rid: str | None = None,
             timeout_s: float = 120.0) -> dict:
    """One /generate call with token ids; returns the response JSON (``meta_info`` included)."""
    body = {"input_ids": input_ids, "sampling_params": {
        "max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}}
    if rid is not None:
        body["rid"] = rid
    status, text = post(port, "/generate", body, timeout_s)
    if status != 200:
        raise RuntimeError(f"/generate answered {status}: {text[:500]}")
    return json.loads(text)


def wait_idle(port: int, timeout_s: float = 60.0) -> list[dict]:
    """Poll /v1/loads until no rank has running or waiting requests; returns the loads."""
    deadline = time.monotonic() + timeout_s
    while True:
        loads = json.loads(get(port, "/v1/loads")[1])["loads"]
        if all(x["num_running_reqs"] == 0 and x["num_waiting_reqs"] == 0 for x in loads):
            return loads
        if time.monotonic() > deadline:
            raise TimeoutError(f"server not idle after {timeout_s} s: {loads}")
        time.sleep(0.2)


def shared_once(tmp_path_factory, name: str, make) -> dict:
    """``make(directory)`` once per test run, whichever xdist worker asks first; every caller gets
    its JSON round-tripped result (paths as strings). A server start is the dominant cost of these
    tests, and pytest-xdist may send the tests of one module to both workers."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the workers of this run
    d = root / name
    d.mkdir(exist_ok=True)
    done = d / "result.json"
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker waits here while the server runs
        if not done.exists():
            done.write_text(json.dumps(make(d), default=str))
        return json.loads(done.read_text())
