"""Drives llama-serve with the official `openai` Python client.

Usage: python llama-serve/tests/openai_client.py PATH/TO/llama-serve --model M.gguf [more args...]

Starts the server on an ephemeral loopback port with an API key and
embeddings, waits for /health, then checks: a completion, a streamed chat
with include_usage, a json_schema response that validates, a streamed
tool call with tool_choice required whose arguments validate against the
tool's schema, the Responses API (text, stream, input_tokens, forced and
streamed function calls, the second turn, text.format, the stateless
400s), n=2, embeddings
(float and base64), and that a wrong key is refused with 401. Exits
non-zero on the first mismatch; always stops the server.
"""

import base64
import json
import struct
import subprocess
import sys
import time
import urllib.request

import jsonschema
import openai

KEY = "ci-secret"


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


def run(base):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=120)
    model = client.models.list().data[0].id

    c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
    check(len(c.choices) == 1 and c.choices[0].text != "", "a completion has text")
    check(c.usage.completion_tokens == 8 and c.choices[0].finish_reason == "length", "max_tokens 8: 8 tokens, finish_reason length")

    messages = [{"role": "user", "content": "List three fruits."}]
    plain = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    check(text == plain.choices[0].message.content, "the streamed chat equals the plain one (greedy)")
    check(usage is not None and usage.completion_tokens == plain.usage.completion_tokens, "include_usage sends the usage")
    check(finish in ("stop", "length"), f"a finish reason ({finish})")

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "population": {"type": "integer", "minimum": 0}},
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Give a city and its population as JSON."}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
    )
    doc = json.loads(r.choices[0].message.content)
    jsonschema.validate(doc, schema)
    check(True, f"a json_schema response validates: {doc}")

    params = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    }
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": params}}]
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=80,
        temperature=0,
        stream=True,
    )
    calls, finish = {}, None
    for chunk in stream:
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                call["id"] = d.id or call["id"]
                if d.function is not None:
                    call["name"] = d.function.name or call["name"]
                    call["arguments"] += d.function.arguments or ""
            finish = choice.finish_reason or finish
    check(finish == "tool_calls", f"a forced tool call ends with finish_reason tool_calls ({finish})")
    check(len(calls) >= 1 and all(c["id"] and c["name"] == "get_weather" for c in calls.values()), f"streamed calls have an id and the tool's name: {calls}")
    for c in calls.values():
        jsonschema.validate(json.loads(c["arguments"]), params)
    check(True, f"the streamed tool call's arguments validate: {calls[0]['arguments']}")

    # Parallel calls allowed (OpenAI's default) on a model that does not
    # stop by itself: the calls still end as tool_calls, whole and streamed.
    asked = dict(model=model, messages=[{"role": "user", "content": "What is the weather in Paris, Rome and Oslo?"}],
                 tools=tools, tool_choice="required", max_tokens=200, temperature=0)
    whole = client.chat.completions.create(**asked)
    choice = whole.choices[0]
    check(choice.finish_reason == "tool_calls", f"parallel forced calls end with tool_calls ({choice.finish_reason}, {whole.usage.completion_tokens} tokens)")
    for c in choice.message.tool_calls:
        jsonschema.validate(json.loads(c.function.arguments), params)
    check(True, f"{len(choice.message.tool_calls)} parallel calls validate")
    finish, n_calls = None, set()
    for chunk in client.chat.completions.create(**asked, stream=True):
        for choice in chunk.choices:
            n_calls.update(d.index for d in choice.delta.tool_calls or [])
            finish = choice.finish_reason or finish
    check(finish == "tool_calls", f"streamed parallel forced calls end with tool_calls ({finish}, {len(n_calls)} calls)")

    responses(client, model, tools, params)

    two = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=1.0, seed=3, n=2)
    check([c.index for c in two.choices] == [0, 1], "n=2 gives two choices")

    e = client.embeddings.create(model=model, input=["a red apple", "a green pear"])
    check(len(e.data) == 2 and len(e.data[0].embedding) > 0, "two embeddings")
    b = client.embeddings.create(model=model, input="a red apple", encoding_format="base64")
    raw = b.data[0].embedding
    if isinstance(raw, str):
        raw = list(struct.unpack(f"<{len(base64.b64decode(raw)) // 4}f", base64.b64decode(raw)))
    check(all(abs(x - y) < 1e-6 for x, y in zip(raw, e.data[0].embedding)), "base64 embeddings equal the float ones")

    bad = openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0)
    try:
        bad.models.list()
        check(False, "a wrong key is refused")
    except openai.AuthenticationError as err:
        check(err.status_code == 401, "a wrong key is refused with 401")


def responses(client, model, tools, params):
    """The Responses API (/v1/responses) through the same client."""
    ask = "The capital of France is"
    r = client.responses.create(model=model, input=ask, max_output_tokens=12, temperature=0)
    check(r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens" and r.output_text, f"responses: text, incomplete at max_output_tokens: {r.output_text!r}")
    check(r.usage.output_tokens == 12 and r.usage.input_tokens > 0, f"responses: usage {r.usage.input_tokens} in, {r.usage.output_tokens} out")

    deltas, last = "", None
    with client.responses.stream(model=model, input=ask, max_output_tokens=24, temperature=0) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas += event.delta
            last = event
    check(last.type == "response.incomplete" and deltas == last.response.output_text, f"responses: streamed deltas equal the final output: {deltas!r}")
    check(deltas.startswith(r.output_text), "responses: greedy, the longer answer starts with the shorter one")

    counted = client.responses.input_tokens.count(model=model, input=ask)
    check(counted.input_tokens == r.usage.input_tokens, f"responses: input_tokens {counted.input_tokens} equals the request's {r.usage.input_tokens}")

    flat = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"], "parameters": t["function"]["parameters"]} for t in tools]
    weather = "What is the weather in Paris?"
    forced = client.responses.create(model=model, input=weather, tools=flat, tool_choice="required", max_output_tokens=200, temperature=0)
    calls = [o for o in forced.output if o.type == "function_call"]
    check(forced.status == "completed" and calls, f"responses: tool_choice required gives {len(calls)} function calls")
    for c in calls:
        jsonschema.validate(json.loads(c.arguments), params)
    check(all(c.call_id and c.name == "get_weather" for c in calls), f"responses: the call's arguments validate: {calls[0].arguments}")

    with client.responses.stream(model=model, input=weather, tools=flat, tool_choice={"type": "function", "name": "get_weather"},
                                 parallel_tool_calls=False, max_output_tokens=200, temperature=0) as stream:
        final = stream.get_final_response()
    s_calls = [o for o in final.output if o.type == "function_call"]
    check(final.status == "completed" and len(s_calls) == 1, f"responses: a streamed named call, one: {[o.type for o in final.output]}")
    jsonschema.validate(json.loads(s_calls[0].arguments), params)

    turn2 = [{"role": "user", "content": weather},
             {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
             {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 degrees and sunny"}]
    after = client.responses.create(model=model, input=turn2, tools=flat, max_output_tokens=16, temperature=0)
    check(after.status in ("completed", "incomplete"), f"responses: the second turn with the call's output: {after.status}")

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"], "additionalProperties": False}
    j = client.responses.create(model=model, input="A city in JSON:", text={"format": {"type": "json_schema", "name": "city", "schema": schema}},
                                max_output_tokens=60, temperature=0)
    jsonschema.validate(json.loads(j.output_text), schema)
    check(True, f"responses: text.format json_schema validates: {j.output_text!r}")

    for what, kwargs in [("previous_response_id", dict(input="x", previous_response_id="resp_1")),
                         ("store: true", dict(input="x", store=True)),
                         ("a function_call_output without its call", dict(input=[{"type": "function_call_output", "call_id": "call_x", "output": "x"}]))]:
        try:
            client.responses.create(model=model, **kwargs)
            check(False, f"responses: {what} is refused")
        except openai.BadRequestError as err:
            check(err.status_code == 400 and err.body.get("type") == "invalid_request_error", f"responses: {what} is a 400 ({err.body.get('message')})")


def main():
    server = subprocess.Popen(
        [sys.argv[1], "--port", "0", "--api-key", KEY, "--embeddings", *sys.argv[2:]],
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
        print("openai client: all checks passed")
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
