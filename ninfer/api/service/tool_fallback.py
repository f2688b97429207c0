"""Tools for a chat template that renders none.

A template that never reads ``tools`` (SmolLM2's, most base ChatML ones) would drop a request's
function declarations and its assistant tool calls without a word, and the model could neither
see nor call a tool. `lower_tools` rewrites such a conversation into plain messages the template
does render, in the text of ninfer's Qwen XML template (ninfer/api/service/templates/qwen_xml.jinja),
whose calls the output parser (ninfer.api.service.toolcalls) reads back:

- the tool list joins the first system message (one is added at the start when there is none);
- an assistant turn's tool calls follow its text as ``<tool_call>`` blocks;
- consecutive tool results become one user turn of ``<tool_response>`` blocks.

llama.cpp's server does the same kind of thing for templates without tool support (a generic
tool prompt); transformers and vLLM render such templates as they are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.meta

TOOLS_HEADER = "# Tools\n\nThese functions are available to you:\n\n<tools>"
TOOLS_FOOTER = (
    "\n</tools>\n\nTo call a function, end your reply with one or more blocks in exactly this "
    "form:\n\n<tool_call>\n<function=function_name>\n<parameter=parameter_name>\nvalue\n"
    "</parameter>\n</function>\n</tool_call>\n\nWrite each value as plain text (strings) or "
    "JSON (numbers, booleans, arrays, objects); values may span several lines. Put any "
    "explanation before the first call, never after the last."
)


def renders_tools(env: jinja2.Environment, source: str) -> tuple[bool, bool]:
    """Whether a template renders tool declarations (it reads the ``tools`` variable) and tool
    calls (it reads ``tool_calls``: then tool results are its own too)."""
    declared = "tools" in jinja2.meta.find_undeclared_variables(env.parse(source))
    return declared, "tool_calls" in source


def uses_tools(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None, renders: tuple[bool, bool]
) -> bool:
    """Whether a conversation has tools the template would drop: declarations it does not read,
    or tool calls and results when it reads no calls."""
    if tools and not renders[0]:
        return True
    return not renders[1] and any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(
        p if isinstance(p, str) else p.get("text") or p.get("refusal") or "" for p in content
    )


def _append(content: Any, text: str) -> Any:
    """Message content with text appended (a text part after a part list)."""
    if isinstance(content, list):
        return [*content, {"type": "text", "text": text}]
    return (content or "") + text


def _calls_text(calls: Sequence[Mapping[str, Any]]) -> str:
    blocks = []
    for call in calls:
        fn = call.get("function", call)
        params = []
        args = fn.get("arguments")
        if isinstance(args, Mapping):
            for name, value in args.items():
                shown = value if isinstance(value, str) else _json(value)
                params.append(f"<parameter={name}>\n{shown}\n</parameter>\n")
        elif args not in (None, ""):  # unparseable JSON text: kept as the call's only content
            params.append(f"{args}\n")
        blocks.append(
            f"<tool_call>\n<function={fn.get('name')}>\n{''.join(params)}</function>\n</tool_call>"
        )
    return "\n".join(blocks)


def lower_tools(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    renders: tuple[bool, bool],
) -> tuple[list[dict[str, Any]], list[Mapping[str, Any]] | None]:
    """(messages, tools) with what the template does not render (`renders_tools`) rewritten as
    plain system / user / assistant text (see the module docstring); messages are normalized
    ones (tool-call arguments parsed into objects where they parse)."""
    if renders[1]:
        out = [dict(m) for m in messages]
    else:
        out = _lower_calls(messages)
    if not tools or renders[0]:
        return out, list(tools) if tools else None
    listing = TOOLS_HEADER + "".join("\n" + _json(t) for t in tools) + TOOLS_FOOTER
    if out and out[0].get("role") in ("system", "developer"):
        out[0]["content"] = _append(out[0].get("content"), "\n\n" + listing)
    else:
        out.insert(0, {"role": "system", "content": listing})
    return out, None


def _lower_calls(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        msg = dict(m)
        if msg.get("role") == "tool":
            block = f"<tool_response>\n{_text(msg.get('content'))}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
            continue
        calls = msg.pop("tool_calls", None)
        if calls:
            text = _text(msg.get("content")).strip()
            msg["content"] = (text + "\n\n" if text else "") + _calls_text(calls)
        out.append(msg)
    for msg in out:
        msg.pop("_tool_results", None)
    return out
