#!/usr/bin/python3
"""Reference renderer for arbor's chat template test (tests/chat/template_reference_test.cc).

Renders chat templates with Python's jinja2 in the environment Hugging Face transformers'
apply_chat_template builds (written from a reading of transformers' chat template utilities, not
copied):

  * jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
    loopcontrols extension and a `{% generation %}...{% endgeneration %}` tag that renders its
    body (transformers' AssistantTracker, minus the index tracking);
  * the `tojson` filter replaced by json.dumps(x, ensure_ascii=False, indent=..., separators=...,
    sort_keys=...) (no HTML escaping);
  * globals raise_exception(msg) (raises jinja2's TemplateError) and strftime_now(fmt);
  * render(messages=..., tools=..., documents=..., add_generation_prompt=..., **kwargs), where
    kwargs are the tokenizer's special tokens (bos_token, eos_token) updated with the caller's
    extra template arguments (enable_thinking, ...). Messages reach the template untouched.

The one deliberate difference: strftime_now formats a fixed instant (--now, Unix seconds, in the
local time zone like datetime.now()), so that the expected text is reproducible.

Usage: render_chat_reference.py --cases CASES.json --out OUT.json --now SECONDS TEMPLATE.jinja...

CASES.json: {"bos_token": str, "eos_token": str, "cases": [{"name": str, "messages": [...],
"tools": [...] (optional), "documents": [...] (optional), "add_generation_prompt": bool,
"kwargs": {...} (optional)}]}.

OUT.json: {"jinja2_version": str, "results": [{"template": file name, "case": name,
"status": "ok" | "raised" | "syntax_error" | "error", "text": output or error message}]}, one
result per template and case, templates in the order given, cases in file order.
"""

import argparse
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class RaisedByTemplate(jinja2.exceptions.TemplateError):
    """What raise_exception() throws: a TemplateError, as in transformers."""


class GenerationBlock(jinja2.ext.Extension):
    """{% generation %}body{% endgeneration %} renders body (transformers marks its span)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


def make_environment(now_seconds):
    def raise_exception(message):
        raise RaisedByTemplate(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.fromtimestamp(now_seconds).strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_case(template, case, special_tokens):
    kwargs = dict(special_tokens)
    kwargs.update(case.get("kwargs", {}))
    try:
        text = template.render(messages=case["messages"], tools=case.get("tools"),
                               documents=case.get("documents"),
                               add_generation_prompt=case["add_generation_prompt"], **kwargs)
        return "ok", text
    except RaisedByTemplate as e:
        return "raised", str(e)
    except Exception as e:  # any other failure of the template: arbor must fail too
        return "error", f"{type(e).__name__}: {e}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--now", type=int, required=True)
    p.add_argument("templates", nargs="+")
    args = p.parse_args()

    with open(args.cases, encoding="utf-8") as f:
        spec = json.load(f)
    special_tokens = {"bos_token": spec["bos_token"], "eos_token": spec["eos_token"]}
    env = make_environment(args.now)
    results = []
    for path in args.templates:
        name = os.path.basename(path)
        with open(path, encoding="utf-8") as f:
            source = f.read()
        try:
            template = env.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            for case in spec["cases"]:
                results.append({"template": name, "case": case["name"], "status": "syntax_error",
                                "text": str(e)})
            continue
        for case in spec["cases"]:
            status, text = render_case(template, case, special_tokens)
            results.append({"template": name, "case": case["name"], "status": status,
                            "text": text})
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"jinja2_version": jinja2.__version__, "results": results}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
