"""The same official-client checks against llama-serve and llama-server,
side by side: the table in docs/server.md.

Usage: python scripts/api_parity.py --llama-serve target/release/llama-serve \
           --llama-server target/llama-tools/build/bin/llama-server --model M.gguf

Runs every check of llama-serve/tests/openai_client.py and
anthropic_client.py against each server, started alike: the same model,
2 threads, 4096 tokens of context over 4 sequences, an API key, the same
chat template (Qwen2.5's, which has tool calls; QwQ's, which thinks, for
the thinking checks), llama-server with --jinja. Prints a Markdown table:
one row per check, "pass" or what failed. (scripts/build-llama-server.sh
builds llama-server from the pinned source.)
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "llama-serve", "tests"))

import anthropic_client  # noqa: E402
import openai_client  # noqa: E402
from sdk import KEY, TEMPLATES, THINKING_TEMPLATE, mmproj, run_checks, says_port  # noqa: E402

TOOL_TEMPLATE = os.path.join(TEMPLATES, "Qwen-Qwen2.5-7B-Instruct.jinja")


def template(needs):
    return THINKING_TEMPLATE if needs == "thinking" else TOOL_TEMPLATE


def ours(binary, model):
    @says_port
    def command(needs, port):
        extra = {"embeddings": ["--embeddings"], "vision": ["--mmproj", mmproj()]}.get(needs, [])
        return [binary, "--model", model, "--port", "0", "--api-key", KEY, "--threads", "2", "--ctx", "4096", "--parallel", "4",
                "--chat-template-file", template(needs), *extra]
    return command


def theirs(binary, model):
    def command(needs, port):
        # llama-server's --embeddings serves embeddings only; mean pooling
        # as llama-serve's (this model defines none).
        extra = {"embeddings": ["--embeddings", "--pooling", "mean"], "vision": ["--mmproj", mmproj()]}.get(needs, [])
        return [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "--api-key", KEY, "-t", "2", "-c", "4096", "-np", "4",
                "--jinja", "--chat-template-file", template(needs), *extra]
    return command


def cell(result):
    return "pass" if result is None else "fails: " + result.replace("|", "\\|").replace("\n", " ")[:140]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--llama-serve", required=True)
    p.add_argument("--llama-server", required=True)
    p.add_argument("--model", required=True)
    a = p.parse_args()
    checks = openai_client.CHECKS + anthropic_client.CHECKS
    columns = {"llama-serve": run_checks(checks, ours(a.llama_serve, a.model)),
               "llama-server": run_checks(checks, theirs(a.llama_server, a.model))}
    print("\n| check | llama-serve | llama-server |\n|---|---|---|")
    for c in checks:
        print(f"| {c.name} | {cell(columns['llama-serve'][c.name])} | {cell(columns['llama-server'][c.name])} |")
    for name, results in columns.items():
        print(f"{name}: {sum(r is None for r in results.values())} of {len(results)} pass")


if __name__ == "__main__":
    main()
