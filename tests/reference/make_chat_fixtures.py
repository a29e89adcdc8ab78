"""Record chat-template renderings made by transformers' apply_chat_template, for
tests/test_chat_template.py (which checks ds4py.chat against them without
transformers). Opt-in; CI only reads the result.

    python tests/reference/make_chat_fixtures.py [--qwen35-template PATH]

Writes tests/golden/tokenizer/chat_renderings.json: for each case the template
(by name), the inputs (messages, tools, keyword arguments, bos/eos token text)
and the text transformers rendered -- or the error message when it raised.

Templates:
- "qwen3.5": the real Qwen3.5 chat template. It is NOT committed; only its
  sha256 is. It is read from llama.cpp's models/templates/Qwen3.5-4B.jinja
  (the sources vendored in the llama-cpp-python 0.3.36 sdist), found as
  test_chat_template.find_qwen35_template() finds it, or from --qwen35-template.
- "chatml-golden": the template of the golden test models
  (tests/golden/models/tokenizer_config.json).
- "features-*": small templates of our own that exercise each part of
  transformers' Jinja environment (tojson options, trim/lstrip blocks, loop
  controls, namespace, dict, raise_exception, the generation tag, message
  normalisation). These run in CI whatever is installed.

Needs transformers (5.24 here); the tokenizer object it renders through is
built from the golden tokenizer.json (any tokenizer would do: rendering does
not depend on the vocabulary, only on the special-token strings passed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from test_chat_template import (  # noqa: E402  (the test's own locator and case data)
    FEATURE_TEMPLATES,
    FIXTURE,
    find_qwen35_template,
)

GOLDEN_TOKENIZER = ROOT / "tests" / "golden" / "models"


def _tools():
    return [
        {"type": "function", "function": {
            "name": "get_weather",
            "description": ("Get the current weather in a city — °C or °F, «quoted» "
                            "<b>html</b> & more"),
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "description": "城市名, e.g. 東京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
            }, "required": ["city"]},
        }},
        {"type": "function", "function": {
            "name": "run_python",
            "description": "Run code.\nReturns stdout.",
            "parameters": {"type": "object", "properties": {
                "code": {"type": "string"},
                "options": {"type": "object", "properties": {"timeout": {"type": "number"}}},
                "flags": {"type": "array", "items": {"type": "boolean"}},
            }, "required": ["code"]},
        }},
    ]


def qwen_cases():
    sys_msg = {"role": "system", "content": "You are a helpful assistant.  \n"}
    user = {"role": "user", "content": "What's the weather in Paris? 🌧️ Answer in <b>bold</b>."}
    tool_call_turn = {
        "role": "assistant",
        "content": "Let me check.",
        "reasoning_content": "\nThe user wants weather; call the tool.\n",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {
                "name": "get_weather",
                "arguments": {"city": "Paris", "unit": "celsius", "days": 3}}},
            {"type": "function", "function": {
                "name": "run_python",
                "arguments": {"code": "print('héllo')\nprint(1 < 2)",
                              "options": {"timeout": 1.5, "nested": [1, "二", None]},
                              "flags": [True, False], "verbose": False, "limit": None}}},
        ],
    }
    tool_results = [
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 18, "sky": "rain"}'},
        {"role": "tool", "content": "héllo\nTrue"},
    ]
    final = {"role": "assistant", "content": "It is 18 °C and raining in Paris."}
    history = [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "<think>\nGreeting.\n</think>\n\nHello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the GPU stop? It ran out of memory.",
         "reasoning_content": "A short joke."},
        {"role": "user", "content": "Another one, in 日本語."},
    ]
    cases = []

    def add(name, messages, tools=None, **kw):
        for think in (True, False):
            cases.append({"name": f"{name}/thinking={'on' if think else 'off'}",
                          "template": "qwen3.5", "messages": messages, "tools": tools,
                          "kwargs": {"enable_thinking": think, "add_generation_prompt": True,
                                     **kw},
                          "bos_token": None, "eos_token": "<|im_end|>"})

    add("user", [user])
    add("system+user", [sys_msg, user])
    add("tools", [user], tools=_tools())
    add("system+tools", [sys_msg, user], tools=_tools())
    add("history", history)
    add("tool-flow", [sys_msg, user, tool_call_turn, *tool_results], tools=_tools())
    add("tool-flow-final", [sys_msg, user, tool_call_turn, *tool_results, final,
                            {"role": "user", "content": "Thanks. And tomorrow?"}],
        tools=_tools())
    add("assistant-empty-content-toolcall",
        [user, {"role": "assistant", "content": None, "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
         {"role": "tool", "content": "snow"}], tools=_tools())
    add("reasoning-alias", [user, {"role": "assistant", "content": "ok",
                                   "reasoning": "aliased reasoning"},
                            {"role": "user", "content": "and?"}])
    add("multi-step-tool-reasoning",
        [user, tool_call_turn, tool_results[0],
         {"role": "assistant", "content": "Need more.", "reasoning_content": "step 2",
          "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Lyon"}}}]},
         {"role": "tool", "content": "sun"}], tools=_tools())
    add("content-parts",
        [{"role": "system", "content": [{"type": "text", "text": "Sys as parts."}]},
         {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image"},
                                      {"type": "text", "text": " and "},
                                      {"type": "video", "video": "v.mp4"}]}])
    cases.append({"name": "no-generation-prompt", "template": "qwen3.5",
                  "messages": [sys_msg, user, final], "tools": None,
                  "kwargs": {"enable_thinking": True, "add_generation_prompt": False},
                  "bos_token": None, "eos_token": "<|im_end|>"})
    cases.append({"name": "vision-ids", "template": "qwen3.5",
                  "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                                            {"type": "text", "text": "diff?"}]}],
                  "tools": None,
                  "kwargs": {"enable_thinking": False, "add_generation_prompt": True,
                             "add_vision_id": True},
                  "bos_token": None, "eos_token": "<|im_end|>"})
    for name, msgs in [
        ("error-no-user", [sys_msg]),
        ("error-system-not-first", [user, sys_msg]),
        ("error-bad-role", [user, {"role": "narrator", "content": "x"}]),
        ("error-image-in-system", [{"role": "system", "content": [{"type": "image"}]}, user]),
    ]:
        cases.append({"name": name, "template": "qwen3.5", "messages": msgs, "tools": None,
                      "kwargs": {"enable_thinking": True, "add_generation_prompt": True},
                      "bos_token": None, "eos_token": "<|im_end|>"})
    return cases


def feature_cases():
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Ünïcode <&> \"q\" 'a'", "extra": None},
        {"role": "assistant", "content": "A", "thinking": "T"},
        {"role": "user", "content": "u2"},
    ]
    cases = []
    for name in FEATURE_TEMPLATES:
        if name == "features-raise":
            continue
        for i, (kw, tools) in enumerate([
            ({"add_generation_prompt": True, "enable_thinking": True}, None),
            ({"add_generation_prompt": False, "enable_thinking": False, "custom_flag": "yes"},
             _tools()),
        ]):
            cases.append({"name": f"{name}/{i}", "template": name, "messages": msgs,
                          "tools": tools, "kwargs": kw,
                          "bos_token": "<s>", "eos_token": "</s>"})
    for name, m in (("features-raise/error", msgs), ("features-raise/ok", msgs[1:2])):
        cases.append({"name": name, "template": "features-raise", "messages": m,
                      "tools": None, "kwargs": {"add_generation_prompt": True},
                      "bos_token": None, "eos_token": None})
    return cases


def golden_cases():
    return [{"name": f"chatml-golden/{i}", "template": "chatml-golden",
             "messages": [{"role": "system", "content": "sys"},
                          {"role": "user", "content": "héllo <|im_end|>"}],
             "tools": None, "kwargs": {"add_generation_prompt": gp, "enable_thinking": True},
             "bos_token": None, "eos_token": "<|im_end|>"} for i, gp in enumerate((True, False))]


def render_hf(template: str, case: dict):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(GOLDEN_TOKENIZER / "tokenizer.json"),
                                  bos_token=case["bos_token"], eos_token=case["eos_token"])
    try:
        text = tok.apply_chat_template(case["messages"], tools=case["tools"],
                                       chat_template=template, tokenize=False,
                                       **case["kwargs"])
        return {"expected": text}
    except Exception as e:  # recorded: ds4py must raise too
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qwen35-template", help="path of the Qwen3.5 chat template (.jinja)")
    args = ap.parse_args()
    import transformers

    qpath = Path(args.qwen35_template) if args.qwen35_template else find_qwen35_template(None)
    if qpath is None:
        raise SystemExit("make_chat_fixtures: no Qwen3.5 template found; pass --qwen35-template "
                         "or set DS4_LLAMA_CPP_SRC (see test_chat_template.find_qwen35_template)")
    qsrc = qpath.read_text(encoding="utf-8")
    golden_src = json.loads((GOLDEN_TOKENIZER / "tokenizer_config.json").read_text())[
        "chat_template"]
    sources = {"qwen3.5": qsrc, "chatml-golden": golden_src, **FEATURE_TEMPLATES}
    templates = {}
    for name, src in sources.items():
        entry = {"sha256": hashlib.sha256(src.encode("utf-8")).hexdigest()}
        if name == "qwen3.5":
            entry["source"] = ("llama.cpp models/templates/Qwen3.5-4B.jinja (vendored in the "
                               "llama-cpp-python 0.3.36 sdist); not committed")
        elif name == "chatml-golden":
            entry["source"] = "tests/golden/models/tokenizer_config.json chat_template"
        else:
            entry["source"] = "tests/test_chat_template.py FEATURE_TEMPLATES"
        templates[name] = entry
    cases = []
    for case in qwen_cases() + golden_cases() + feature_cases():
        case.update(render_hf(sources[case["template"]], case))
        cases.append(case)
    out = {
        "comment": "Written by tests/reference/make_chat_fixtures.py; do not edit by hand.",
        "transformers": transformers.__version__,
        "templates": templates,
        "cases": cases,
    }
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    n_err = sum("error" in c for c in cases)
    print(f"wrote {FIXTURE} ({len(cases)} cases, {n_err} errors recorded) "
          f"from {qpath} (sha256 {templates['qwen3.5']['sha256'][:16]})")


if __name__ == "__main__":
    main()
