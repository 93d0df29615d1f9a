"""Reference renderer for tests/it/chat_template.rs: renders chat templates with
jinja2 configured the way Hugging Face transformers' `apply_chat_template`
configures it (an immutable sandbox, trim_blocks and lstrip_blocks,
loopcontrols, a `{% generation %}` tag that renders its body, `tojson` as
`json.dumps` with non-ASCII kept, `raise_exception`, `strftime_now`).

Reads a JSON list of cases on stdin, each
  {"template": PATH, "messages": [...], "tools": [...] or null,
   "add_generation_prompt": bool, "bos_token": str, "eos_token": str,
   "now": UNIX_SECONDS}
and writes a JSON list of results, each {"ok": TEXT}, {"raised": MESSAGE}
(the template called raise_exception) or {"error": MESSAGE}.
"""

import datetime
import json
import sys

import jinja2
import jinja2.ext
import jinja2.sandbox


class Raised(Exception):
    pass


class GenerationTag(jinja2.ext.Extension):
    # transformers' AssistantTracker: `{% generation %}` marks assistant
    # text for masks and renders its body unchanged.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def environment(now):
    def raise_exception(message):
        raise Raised(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(now, datetime.timezone.utc).strftime(fmt)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(case):
    with open(case["template"], encoding="utf-8") as f:
        source = f.read()
    env = environment(case.get("now", 0))
    try:
        template = env.from_string(source)
        kwargs = dict(case.get("extra") or {})
        text = template.render(
            messages=case["messages"],
            tools=case.get("tools"),
            documents=None,
            add_generation_prompt=case.get("add_generation_prompt", False),
            bos_token=case.get("bos_token", ""),
            eos_token=case.get("eos_token", ""),
            **kwargs,
        )
        return {"ok": text}
    except Raised as e:
        return {"raised": str(e)}
    except Exception as e:  # noqa: BLE001 - any failure is a result to compare
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    cases = json.load(sys.stdin)
    json.dump([render(c) for c in cases], sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
