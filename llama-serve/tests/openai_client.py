"""Drives llama-serve with the official `openai` Python client.

Usage: python llama-serve/tests/openai_client.py PATH/TO/llama-serve --model M.gguf [more args...]

Starts the server on a loopback port with an API key (one instance per
kind of check: plain, with embeddings, with a thinking template), then
checks: a completion, a streamed chat with include_usage, a json_schema
response that validates, streamed and parallel forced tool calls whose
arguments validate against the tool's schema, n=2, embeddings (float and
base64), a wrong key refused with 401, and the Responses API (text,
stream, input_tokens, forced and streamed function calls, the second
turn, text.format, reasoning items, the stateless 400s), and with a
projector a base64 image in Chat Completions and Responses. Reports every
check; exits non-zero if any failed. The same checks run against
llama-server in scripts/api_parity.py.
"""

import base64
import json
import struct
import sys

import jsonschema
import openai

from sdk import KEY, Check, check, jpeg_base64, main

MESSAGES = [{"role": "user", "content": "List three fruits."}]
PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": PARAMS}}]
# The Responses API's tools are flat.
FLAT_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
WEATHER = "What is the weather in Paris?"
ASK = "The capital of France is"


def client(base, key=KEY):
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)


def model(c):
    return c.models.list().data[0].id


def completion(base):
    c = client(base)
    r = c.completions.create(model=model(c), prompt=ASK, max_tokens=8, temperature=0)
    check(len(r.choices) == 1 and r.choices[0].text != "", "a completion has text")
    check(r.usage.completion_tokens == 8 and r.choices[0].finish_reason == "length", "max_tokens 8: 8 tokens, finish_reason length")


def chat_stream(base):
    c = client(base)
    plain = c.chat.completions.create(model=model(c), messages=MESSAGES, max_tokens=12, temperature=0)
    stream = c.chat.completions.create(model=model(c), messages=MESSAGES, max_tokens=12, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
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


def chat_json_schema(base):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "population": {"type": "integer", "minimum": 0}},
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    c = client(base)
    r = c.chat.completions.create(
        model=model(c), messages=[{"role": "user", "content": "Give a city and its population as JSON."}], max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
    )
    doc = json.loads(r.choices[0].message.content)
    jsonschema.validate(doc, schema)
    check(True, f"a json_schema response validates: {doc}")


def chat_forced_tool_streamed(base):
    c = client(base)
    stream = c.chat.completions.create(model=model(c), messages=[{"role": "user", "content": WEATHER}], tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=80, temperature=0, stream=True)
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
    for call in calls.values():
        jsonschema.validate(json.loads(call["arguments"]), PARAMS)
    check(True, f"the streamed tool call's arguments validate: {calls[0]['arguments']}")


def chat_parallel_tools(base):
    # Parallel calls allowed (OpenAI's default) on a model that does not
    # stop by itself: the calls still end as tool_calls, whole and streamed.
    c = client(base)
    asked = dict(model=model(c), messages=[{"role": "user", "content": "What is the weather in Paris, Rome and Oslo?"}],
                 tools=TOOLS, tool_choice="required", max_tokens=200, temperature=0)
    whole = c.chat.completions.create(**asked)
    choice = whole.choices[0]
    check(choice.finish_reason == "tool_calls", f"parallel forced calls end with tool_calls ({choice.finish_reason}, {whole.usage.completion_tokens} tokens)")
    for call in choice.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), PARAMS)
    check(True, f"{len(choice.message.tool_calls)} parallel calls validate")
    finish, n_calls = None, set()
    for chunk in c.chat.completions.create(**asked, stream=True):
        for choice in chunk.choices:
            n_calls.update(d.index for d in choice.delta.tool_calls or [])
            finish = choice.finish_reason or finish
    check(finish == "tool_calls", f"streamed parallel forced calls end with tool_calls ({finish}, {len(n_calls)} calls)")


def chat_n2(base):
    c = client(base)
    two = c.chat.completions.create(model=model(c), messages=MESSAGES, max_tokens=8, temperature=1.0, seed=3, n=2)
    check([choice.index for choice in two.choices] == [0, 1], "n=2 gives two choices")


def image_question(url):
    return [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


def chat_image(base):
    c = client(base)
    url = "data:image/jpeg;base64," + jpeg_base64()
    r = c.chat.completions.create(model=model(c), messages=image_question(url), max_tokens=8, temperature=0)
    text_only = [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}]}]
    plain = c.chat.completions.create(model=model(c), messages=text_only, max_tokens=8, temperature=0)
    check(r.choices[0].message.content and r.usage.completion_tokens == 8, "a base64 image in an image_url part is answered")
    check(r.usage.prompt_tokens > plain.usage.prompt_tokens, f"its tokens count ({r.usage.prompt_tokens} with, {plain.usage.prompt_tokens} without)")
    stream = c.chat.completions.create(model=model(c), messages=image_question(url), max_tokens=8, temperature=0, stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    check(streamed == r.choices[0].message.content, "streamed, the same answer")
    resp = c.responses.create(model=model(c), max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "What is in this picture?"},
                                     {"type": "input_image", "image_url": url}]}])
    check(resp.output_text == r.choices[0].message.content, "the Responses API's input_image, the same answer")
    try:
        c.chat.completions.create(model=model(c), messages=image_question("https://example.com/cat.jpg"), max_tokens=4)
        check(False, "a remote image URL is refused")
    except openai.BadRequestError as err:
        body = err.body if isinstance(err.body, dict) else {}
        check(err.status_code == 400 and "not fetched" in str(body.get("message")), f"a remote image URL is a 400 ({body.get('message')})")


def embeddings(base):
    c = client(base)
    e = c.embeddings.create(model=model(c), input=["a red apple", "a green pear"])
    check(len(e.data) == 2 and len(e.data[0].embedding) > 0, "two embeddings")
    b = c.embeddings.create(model=model(c), input="a red apple", encoding_format="base64")
    raw = b.data[0].embedding
    if isinstance(raw, str):
        raw = list(struct.unpack(f"<{len(base64.b64decode(raw)) // 4}f", base64.b64decode(raw)))
    check(len(raw) == len(e.data[0].embedding) and all(abs(x - y) < 1e-6 for x, y in zip(raw, e.data[0].embedding)),
          "base64 embeddings equal the float ones")


def wrong_key(base):
    try:
        client(base, key="wrong").models.list()
        check(False, "a wrong key is refused")
    except openai.AuthenticationError as err:
        check(err.status_code == 401, "a wrong key is refused with 401")


def responses_text(base):
    c = client(base)
    r = c.responses.create(model=model(c), input=ASK, max_output_tokens=12, temperature=0)
    check(r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens" and r.output_text, f"text, incomplete at max_output_tokens: {r.output_text!r}")
    check(r.usage.output_tokens == 12 and r.usage.input_tokens > 0, f"usage {r.usage.input_tokens} in, {r.usage.output_tokens} out")


def responses_stream(base):
    c = client(base)
    short = c.responses.create(model=model(c), input=ASK, max_output_tokens=12, temperature=0)
    deltas, last = "", None
    with c.responses.stream(model=model(c), input=ASK, max_output_tokens=24, temperature=0) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas += event.delta
            last = event
    check(last.type == "response.incomplete" and deltas == last.response.output_text, f"streamed deltas equal the final output: {deltas!r}")
    check(deltas.startswith(short.output_text), "greedy: the longer answer starts with the shorter one")


def responses_input_tokens(base):
    c = client(base)
    r = c.responses.create(model=model(c), input=ASK, max_output_tokens=2, temperature=0)
    counted = c.responses.input_tokens.count(model=model(c), input=ASK)
    check(counted.input_tokens == r.usage.input_tokens, f"input_tokens {counted.input_tokens} equals the request's {r.usage.input_tokens}")


def responses_forced_call(base):
    c = client(base)
    forced = c.responses.create(model=model(c), input=WEATHER, tools=FLAT_TOOLS, tool_choice="required", max_output_tokens=200, temperature=0)
    calls = [o for o in forced.output if o.type == "function_call"]
    check(forced.status == "completed" and calls, f"tool_choice required gives {len(calls)} function calls")
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), PARAMS)
    check(all(call.call_id and call.name == "get_weather" for call in calls), f"the call's arguments validate: {calls[0].arguments}")


def responses_named_call_streamed(base):
    c = client(base)
    with c.responses.stream(model=model(c), input=WEATHER, tools=FLAT_TOOLS, tool_choice={"type": "function", "name": "get_weather"},
                            parallel_tool_calls=False, max_output_tokens=200, temperature=0) as stream:
        final = stream.get_final_response()
    calls = [o for o in final.output if o.type == "function_call"]
    check(final.status == "completed" and len(calls) == 1, f"a streamed named call, one: {[o.type for o in final.output]}")
    jsonschema.validate(json.loads(calls[0].arguments), PARAMS)


def responses_second_turn(base):
    c = client(base)
    turn2 = [{"role": "user", "content": WEATHER},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "18 degrees and sunny"}]
    after = c.responses.create(model=model(c), input=turn2, tools=FLAT_TOOLS, max_output_tokens=16, temperature=0)
    check(after.status in ("completed", "incomplete") and after.usage.input_tokens > 0, f"the second turn with the call's output: {after.status}")


def responses_json_schema(base):
    c = client(base)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"], "additionalProperties": False}
    j = c.responses.create(model=model(c), input="A city in JSON:", text={"format": {"type": "json_schema", "name": "city", "schema": schema}},
                           max_output_tokens=60, temperature=0)
    jsonschema.validate(json.loads(j.output_text), schema)
    check(j.text.format.type == "json_schema", f"text.format json_schema validates and is echoed: {j.output_text!r}")


def responses_reasoning(base):
    c = client(base)
    asked = dict(model=model(c), input="Why is the sky blue?", reasoning={"effort": "minimal"}, max_output_tokens=160, temperature=0)
    r = c.responses.create(**asked)
    kinds = [o.type for o in r.output]
    check(kinds[:1] == ["reasoning"] and "message" in kinds, f"a reasoning item, then the message: {kinds}")
    thoughts = "".join(part.text for part in r.output[0].content or [])
    check(thoughts and "think>" not in thoughts and "think>" not in r.output_text, f"the thoughts apart from the answer: {thoughts[:60]!r}")
    streamed = ""
    with c.responses.stream(**asked) as stream:
        for event in stream:
            if event.type == "response.reasoning_text.delta":
                streamed += event.delta
    check(streamed == thoughts, "the streamed reasoning deltas equal the whole answer's thoughts")


def responses_refusals(base):
    c = client(base)
    for what, kwargs in [("previous_response_id", dict(input="x", previous_response_id="resp_1")),
                         ("store: true", dict(input="x", store=True)),
                         ("a function_call_output without its call", dict(input=[{"type": "function_call_output", "call_id": "call_x", "output": "x"}]))]:
        try:
            c.responses.create(model=model(c), max_output_tokens=4, **kwargs)
            check(False, f"{what} is refused")
        except openai.BadRequestError as err:
            body = err.body if isinstance(err.body, dict) else {}
            check(err.status_code == 400 and body.get("type") == "invalid_request_error", f"{what} is a 400 ({body.get('message')})")


CHECKS = [
    Check("completions: text, max_tokens, finish_reason", completion),
    Check("chat: stream equals the whole answer, include_usage", chat_stream),
    Check("chat: response_format json_schema validates", chat_json_schema),
    Check("chat: tool_choice required, streamed, arguments validate", chat_forced_tool_streamed),
    Check("chat: parallel forced calls end as tool_calls", chat_parallel_tools),
    Check("chat: n=2", chat_n2),
    Check("chat and responses: a base64 image (synthetic projector)", chat_image, needs="vision"),
    Check("embeddings: float and base64", embeddings, needs="embeddings"),
    Check("auth: a wrong key is a 401", wrong_key),
    Check("responses: text, incomplete at max_output_tokens, usage", responses_text),
    Check("responses: stream deltas equal the final output", responses_stream),
    Check("responses: input_tokens equals the request's", responses_input_tokens),
    Check("responses: tool_choice required, arguments validate", responses_forced_call),
    Check("responses: a named call, streamed", responses_named_call_streamed),
    Check("responses: second turn with function_call_output", responses_second_turn),
    Check("responses: text.format json_schema validates", responses_json_schema),
    Check("responses: reasoning items (thinking template)", responses_reasoning, needs="thinking"),
    Check("responses: stateless 400s (previous_response_id, store, orphan output)", responses_refusals),
]

if __name__ == "__main__":
    main("openai client", CHECKS, sys.argv)
