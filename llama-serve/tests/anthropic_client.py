"""Drives llama-serve's /v1/messages with the official `anthropic` Python client.

Usage: python llama-serve/tests/anthropic_client.py PATH/TO/llama-serve --model M.gguf [more args...]

Starts the server on an ephemeral loopback port with an API key (the
client sends it as `x-api-key`), waits for /health, then checks: a text
answer, a stream whose text deltas add up to the final message, a forced
tool use (`tool_choice` any, and a named tool, streamed) whose input
validates against the tool's schema, the second turn with the tool's
result, count_tokens equal to the same request's input tokens, stop
sequences, and Anthropic's error shape for what the API forbids and for a
wrong key. Exits non-zero on the first mismatch; always stops the server.
"""

import subprocess
import sys
import time
import urllib.request

import anthropic
import jsonschema

KEY = "ci-secret"
# The SDK has no sampling parameters any more; the server still reads
# `temperature` from the body.
GREEDY = {"temperature": 0}


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}", flush=True)


def wait_ready(base):
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("FAILED: the server never became ready")


def error_of(call):
    """The anthropic.APIStatusError a call raises (the check fails if none)."""
    try:
        call()
    except anthropic.APIStatusError as err:
        return err
    raise SystemExit("FAILED: the call was not refused")


def run(base):
    client = anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0, timeout=120)
    model = "default"
    ask = [{"role": "user", "content": "The capital of France is"}]

    m = client.messages.create(model=model, max_tokens=12, extra_body=GREEDY, messages=ask)
    check(m.type == "message" and m.role == "assistant" and m.content and m.content[0].type == "text", f"a text answer: {m.content[0].text!r}")
    check(m.stop_reason in ("end_turn", "max_tokens") and m.usage.output_tokens > 0 and m.usage.input_tokens > 0, f"stop_reason {m.stop_reason}, usage {m.usage}")

    with client.messages.stream(model=model, max_tokens=24, extra_body=GREEDY, messages=ask) as stream:
        deltas = "".join(stream.text_stream)
        final = stream.get_final_message()
    text = "".join(b.text for b in final.content if b.type == "text")
    check(deltas == text, f"streamed deltas equal the final message: {text!r}")
    check(text.startswith(m.content[0].text), "greedy: the longer answer starts with the shorter one")
    check(final.usage.output_tokens > 0, f"the stream's final usage: {final.usage}")

    counted = client.messages.count_tokens(model=model, messages=ask)
    check(counted.input_tokens == m.usage.input_tokens, f"count_tokens {counted.input_tokens} equals the request's input_tokens {m.usage.input_tokens}")

    # The greedy answer above has a line break within its first 12 tokens.
    stopped = client.messages.create(model=model, max_tokens=40, extra_body=GREEDY, messages=ask, stop_sequences=["\n"])
    check(stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "\n" and "\n" not in stopped.content[0].text,
          f"stop_sequences: {stopped.stop_reason} {stopped.stop_sequence!r}, {stopped.content[0].text!r}")

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    }
    tools = [{"name": "get_weather", "description": "The weather in a city", "input_schema": schema}]
    weather = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced = client.messages.create(model=model, max_tokens=200, extra_body=GREEDY, messages=weather, tools=tools, tool_choice={"type": "any"})
    uses = [b for b in forced.content if b.type == "tool_use"]
    check(forced.stop_reason == "tool_use" and uses, f"tool_choice any: stop_reason {forced.stop_reason}, {len(uses)} tool_use blocks")
    for u in uses:
        jsonschema.validate(u.input, schema)
    check(all(u.name == "get_weather" and u.id.startswith("toolu_") for u in uses), f"the tool_use input validates: {uses[0].input}")

    with client.messages.stream(model=model, max_tokens=200, extra_body=GREEDY, messages=weather, tools=tools,
                                tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        streamed = stream.get_final_message()
    s_uses = [b for b in streamed.content if b.type == "tool_use"]
    check(streamed.stop_reason == "tool_use" and s_uses, f"streamed named tool: stop_reason {streamed.stop_reason}")
    for u in s_uses:
        jsonschema.validate(u.input, schema)
    check(True, f"the streamed tool_use input validates: {s_uses[0].input}")

    turn2 = weather + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id, "name": uses[0].name, "input": uses[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "18 degrees and sunny"}]},
    ]
    after = client.messages.create(model=model, max_tokens=24, extra_body=GREEDY, messages=turn2, tools=tools)
    check(after.stop_reason in ("end_turn", "max_tokens", "tool_use"), f"the second turn with the tool's result: {after.stop_reason}")

    for what, kwargs in [
        ("empty messages", dict(max_tokens=8, messages=[])),
        ("max_tokens 0", dict(max_tokens=0, messages=ask)),
        ("a tool_result without its tool_use", dict(max_tokens=8, messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "x"}]}])),
    ]:
        err = error_of(lambda: client.messages.create(model=model, **kwargs))
        body = err.body if isinstance(err.body, dict) else {}
        check(err.status_code == 400 and body.get("type") == "error" and body.get("error", {}).get("type") == "invalid_request_error",
              f"{what}: 400 in Anthropic's shape ({body})")

    bad = anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0)
    err = error_of(lambda: bad.messages.create(model=model, max_tokens=8, messages=ask))
    check(isinstance(err, anthropic.AuthenticationError) and err.body.get("error", {}).get("type") == "authentication_error", "a wrong x-api-key is a 401 in Anthropic's shape")


def main():
    server = subprocess.Popen(
        [sys.argv[1], "--port", "0", "--api-key", KEY, *sys.argv[2:]],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = server.stdout.readline().strip()
        if not line.startswith("listening on http://127.0.0.1:"):
            raise SystemExit(f"FAILED: first line {line!r}")
        base = line.removeprefix("listening on ")
        wait_ready(base)
        run(base)
        print("anthropic client: all checks passed")
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
