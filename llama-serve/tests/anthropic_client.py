"""Drives llama-serve's /v1/messages with the official `anthropic` Python client.

Usage: python llama-serve/tests/anthropic_client.py PATH/TO/llama-serve --model M.gguf [more args...]

Starts the server on a loopback port with an API key (the client sends it
as `x-api-key`; a second instance with a thinking template), then checks:
a text answer, a stream whose text deltas add up to the final message,
count_tokens equal to the same request's input tokens, stop sequences, a
forced tool use (`tool_choice` any, and a named tool, streamed) whose
input validates against the tool's schema, the second turn with the
tool's result, thinking blocks, a base64 image block (with a projector),
and Anthropic's error shape for what the
API forbids and for a wrong key. Reports every check; exits non-zero if
any failed. The same checks run against llama-server in
scripts/api_parity.py.
"""

import sys

import anthropic
import jsonschema

from sdk import KEY, Check, check, jpeg_base64, main

MODEL = "default"
# The SDK has no sampling parameters any more; the server still reads
# `temperature` from the body.
GREEDY = {"temperature": 0}
ASK = [{"role": "user", "content": "The capital of France is"}]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [{"name": "get_weather", "description": "The weather in a city", "input_schema": SCHEMA}]
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def client(base, key=KEY):
    return anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=120)


def error_of(call):
    """The anthropic.APIStatusError a call raises (the check fails if none)."""
    try:
        call()
    except anthropic.APIStatusError as err:
        return err
    check(False, "the call was refused")


def text(base):
    m = client(base).messages.create(model=MODEL, max_tokens=12, extra_body=GREEDY, messages=ASK)
    check(m.type == "message" and m.role == "assistant" and m.content and m.content[0].type == "text", f"a text answer: {m.content[0].text!r}")
    check(m.stop_reason in ("end_turn", "max_tokens") and m.usage.output_tokens > 0 and m.usage.input_tokens > 0, f"stop_reason {m.stop_reason}, usage {m.usage}")


def stream(base):
    c = client(base)
    short = c.messages.create(model=MODEL, max_tokens=12, extra_body=GREEDY, messages=ASK)
    with c.messages.stream(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=ASK) as s:
        deltas = "".join(s.text_stream)
        final = s.get_final_message()
    whole = "".join(b.text for b in final.content if b.type == "text")
    check(deltas == whole, f"streamed deltas equal the final message: {whole!r}")
    check(whole.startswith(short.content[0].text), "greedy: the longer answer starts with the shorter one")
    check(final.usage.output_tokens > 0, f"the stream's final usage: {final.usage}")


def count_tokens(base):
    c = client(base)
    m = c.messages.create(model=MODEL, max_tokens=2, extra_body=GREEDY, messages=ASK)
    counted = c.messages.count_tokens(model=MODEL, messages=ASK)
    check(counted.input_tokens == m.usage.input_tokens, f"count_tokens {counted.input_tokens} equals the request's input_tokens {m.usage.input_tokens}")


def stop_sequences(base):
    c = client(base)
    free = c.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=ASK).content[0].text
    # A stop sequence the greedy answer reaches: its second word.
    words = free.split()
    check(len(words) >= 2, f"the greedy answer has two words: {free!r}")
    stop = words[1]
    stopped = c.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=ASK, stop_sequences=[stop])
    check(stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop and stopped.content[0].text == free[:free.index(stop)],
          f"stop_sequences: {stopped.stop_reason} {stopped.stop_sequence!r}, {stopped.content[0].text!r}")


def forced_tool(base):
    forced = client(base).messages.create(model=MODEL, max_tokens=200, extra_body=GREEDY, messages=WEATHER, tools=TOOLS, tool_choice={"type": "any"})
    uses = [b for b in forced.content if b.type == "tool_use"]
    check(forced.stop_reason == "tool_use" and uses, f"tool_choice any: stop_reason {forced.stop_reason}, {len(uses)} tool_use blocks")
    for u in uses:
        jsonschema.validate(u.input, SCHEMA)
    # Tool-call ids are the library's one scheme: nine letters and digits
    # (what every chat template takes back, Mistral's included).
    check(all(u.name == "get_weather" and len(u.id) == 9 and u.id.isalnum() for u in uses), f"the tool_use input validates: {uses[0].input}")


def named_tool_streamed(base):
    with client(base).messages.stream(model=MODEL, max_tokens=200, extra_body=GREEDY, messages=WEATHER, tools=TOOLS,
                                      tool_choice={"type": "tool", "name": "get_weather"}) as s:
        streamed = s.get_final_message()
    uses = [b for b in streamed.content if b.type == "tool_use"]
    check(streamed.stop_reason == "tool_use" and uses, f"streamed named tool: stop_reason {streamed.stop_reason}")
    for u in uses:
        jsonschema.validate(u.input, SCHEMA)
    check(True, f"the streamed tool_use input validates: {uses[0].input}")


def second_turn(base):
    turn2 = WEATHER + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "unit": "celsius"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 degrees and sunny"}]},
    ]
    after = client(base).messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=turn2, tools=TOOLS)
    check(after.stop_reason in ("end_turn", "max_tokens", "tool_use") and after.usage.input_tokens > 0, f"the second turn with the tool's result: {after.stop_reason}")


def thinking(base):
    c = client(base)
    asked = dict(model=MODEL, max_tokens=48, extra_body=GREEDY, messages=[{"role": "user", "content": "Why is the sky blue?"}],
                 thinking={"type": "enabled", "budget_tokens": 16})
    m = c.messages.create(**asked)
    kinds = [b.type for b in m.content]
    check(kinds == ["thinking", "text"], f"a thinking block, then the text: {kinds}")
    thoughts = m.content[0].thinking
    check(thoughts and "think>" not in thoughts and "think>" not in m.content[1].text, f"the thoughts apart from the answer: {thoughts[:60]!r}")
    with c.messages.stream(**asked) as s:
        streamed = "".join(e.delta.thinking for e in s if e.type == "content_block_delta" and e.delta.type == "thinking_delta")
    check(streamed == thoughts, "the streamed thinking deltas equal the whole answer's thoughts")


def refusals(base):
    c = client(base)
    for what, kwargs in [
        ("empty messages", dict(max_tokens=8, messages=[])),
        ("max_tokens 0", dict(max_tokens=0, messages=ASK)),
        ("a tool_result without its tool_use", dict(max_tokens=8, messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "x"}]}])),
    ]:
        err = error_of(lambda: c.messages.create(model=MODEL, **kwargs))
        body = err.body if isinstance(err.body, dict) else {}
        check(err.status_code == 400 and body.get("type") == "error" and body.get("error", {}).get("type") == "invalid_request_error",
              f"{what}: 400 in Anthropic's shape ({body})")


def wrong_key(base):
    err = error_of(lambda: client(base, key="wrong").messages.create(model=MODEL, max_tokens=8, messages=ASK))
    body = err.body if isinstance(err.body, dict) else {}
    check(isinstance(err, anthropic.AuthenticationError) and body.get("error", {}).get("type") == "authentication_error",
          f"a wrong x-api-key is a 401 in Anthropic's shape ({err.status_code}, {body})")


def image(base):
    c = client(base)
    question = {"type": "text", "text": "What is in this picture?"}
    picture = {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": jpeg_base64()}}
    m = c.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [question, picture]}], extra_body=GREEDY)
    plain = c.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [question]}], extra_body=GREEDY)
    check(m.content and m.content[0].type == "text" and m.usage.output_tokens == 8, "a base64 image block is answered")
    check(m.usage.input_tokens > plain.usage.input_tokens, f"its tokens count ({m.usage.input_tokens} with, {plain.usage.input_tokens} without)")


CHECKS = [
    Check("messages: text, stop_reason, usage", text),
    Check("messages: stream deltas equal the final message", stream),
    Check("messages: count_tokens equals the request's input_tokens", count_tokens),
    Check("messages: stop_sequences", stop_sequences),
    Check("messages: tool_choice any, input validates", forced_tool),
    Check("messages: a named tool, streamed", named_tool_streamed),
    Check("messages: second turn with tool_result", second_turn),
    Check("messages: thinking blocks (thinking template)", thinking, needs="thinking"),
    Check("messages: a base64 image block (synthetic projector)", image, needs="vision"),
    Check("messages: 400s in Anthropic's shape (empty, max_tokens 0, orphan tool_result)", refusals),
    Check("messages: a wrong x-api-key is a 401 in Anthropic's shape", wrong_key),
]

if __name__ == "__main__":
    main("anthropic client", CHECKS, sys.argv)
