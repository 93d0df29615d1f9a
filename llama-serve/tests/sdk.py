"""What the official-client scripts (openai_client.py, anthropic_client.py)
share: checks that name what they verify, a server started per group of
checks, and a runner that reports every check rather than the first.

A script is a list of `Check`s. Each needs one kind of server: `base`
(the arguments given), `embeddings` (an embeddings endpoint), `thinking`
(a chat template whose model thinks) or `vision` (a projector, for
images: `LLAMA_TEST_MMPROJ`), so the same checks run
against llama-serve in CI and against llama-server side by side
(scripts/api_parity.py), each server started as its own flags say.
"""

import base64
import os
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from typing import Callable

KEY = "ci-secret"
TEMPLATES = os.path.join(os.path.dirname(__file__), "..", "..", "vendor", "llama.cpp", "models", "templates")
# A template that opens the model's thoughts (QwQ's generation prompt ends
# in `<think>`), so a base model "thinks" until its budget closes them.
THINKING_TEMPLATE = os.path.join(TEMPLATES, "Qwen-QwQ-32B.jinja")
# The image the vision checks send (llama.cpp's own test image).
TEST_JPEG = os.path.join(os.path.dirname(__file__), "..", "..", "vendor", "llama.cpp", "tools", "mtmd", "test-1.jpeg")


def mmproj():
    """The projector the `vision` checks' servers load: LLAMA_TEST_MMPROJ,
    written by `cargo run --example tiny_projector -- --model M OUT` (a
    synthetic one: outputs do not describe the image)."""
    path = os.environ.get("LLAMA_TEST_MMPROJ")
    if not path:
        raise Failed("the vision checks need LLAMA_TEST_MMPROJ: cargo run --example tiny_projector -- --model M OUT.gguf")
    return path


def jpeg_base64():
    with open(TEST_JPEG, "rb") as f:
        return base64.b64encode(f.read()).decode()


class Failed(Exception):
    """A check that did not hold; its message says which and what was seen."""


def check(cond, what):
    if not cond:
        raise Failed(what)
    print(f"  ok: {what}", flush=True)


@dataclass
class Check:
    name: str
    run: Callable[[str], None]  # takes the server's base URL
    needs: str = "base"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base, server):
    deadline = time.time() + 120
    while time.time() < deadline:
        if server.poll() is not None:
            raise Failed(f"the server exited with {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise Failed("the server never became ready")


def listening(server):
    """The base URL llama-serve prints first (it was started with
    `--port 0`: the kernel picked a free port, so no other process can have
    taken it in between)."""
    line = server.stdout.readline().strip()
    if not line.startswith("listening on http://127.0.0.1:"):
        raise Failed(f"the server's first line is {line!r}")
    return line.removeprefix("listening on ")


def run_checks(checks, command):
    """Runs each check against a server started by `command(needs, port)`
    (an argv; `port` is None for llama-serve, which takes `--port 0` and
    says where it listens), one server per kind of need; returns {name:
    None or the failure}. Always stops the servers."""
    results = {}
    for needs in dict.fromkeys(c.needs for c in checks):
        port = None if getattr(command, "says_port", False) else free_port()
        server = subprocess.Popen(command(needs, port), stdout=subprocess.PIPE if port is None else subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, text=True)
        try:
            base = listening(server) if port is None else f"http://127.0.0.1:{port}"
            wait_ready(base, server)
            for c in (c for c in checks if c.needs == needs):
                print(f"{c.name}", flush=True)
                try:
                    c.run(base)
                    results[c.name] = None
                except Exception as err:  # a client error is a failed check too
                    results[c.name] = f"{type(err).__name__}: {err}"[:300]
                    print(f"  FAILED: {results[c.name]}", flush=True)
        except Failed as err:
            for c in (c for c in checks if c.needs == needs):
                results[c.name] = str(err)
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
    return results


def says_port(command):
    """Marks a server command that takes `--port 0` and prints where it
    listens (llama-serve)."""
    command.says_port = True
    return command


def llama_serve(binary, args):
    """How llama-serve is started for each kind of check."""
    extra = {"base": lambda: [], "embeddings": lambda: ["--embeddings"],
             "thinking": lambda: ["--chat-template-file", THINKING_TEMPLATE], "vision": lambda: ["--mmproj", mmproj()]}
    return says_port(lambda needs, port: [binary, "--port", "0", "--api-key", KEY, *args, *extra[needs]()])


def main(name, checks, argv):
    """`python SCRIPT PATH/TO/llama-serve --model M.gguf [more args]`:
    every check against llama-serve; exits non-zero if any failed."""
    results = run_checks(checks, llama_serve(argv[1], argv[2:]))
    failed = {k: v for k, v in results.items() if v is not None}
    if failed:
        for k, v in failed.items():
            print(f"FAILED: {k}: {v}")
        raise SystemExit(f"{name}: {len(failed)} of {len(results)} checks failed")
    print(f"{name}: all {len(results)} checks passed")
