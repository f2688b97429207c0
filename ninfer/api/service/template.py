"""Chat-template rendering and prompt encoding.

Three steps turn a normalized conversation into prompt token ids:

1. `resolve_template_options` (ninfer.api.service.template_options) merges the typed request fields,
   `chat_template_kwargs` and the server defaults into the variables the template sees,
   rejecting conflicts and reserved names.
2. `ChatTemplate.render` runs the Jinja template in a sandbox configured like Hugging Face's
   `apply_chat_template` (trim_blocks, lstrip_blocks, loopcontrols, `raise_exception`, a `tojson`
   that keeps member order and does not escape non-ASCII). It returns a `RenderedPrompt`: the text
   plus the spans of control tokens that the *template* wrote.
3. `encode_prompt` (ninfer.api.service.prompt_encoding) encodes that text: the spans become their
   control-token ids, and everything else - including control-token spellings quoted in message
   content, tool data or kwargs - is encoded as ordinary text.

The option and encoding names are re-exported here for existing importers.

How content is kept apart from markup: before rendering, every control-token spelling inside a
content string (and a partial spelling at either end of one, so that adjacent strings cannot
join into one) is replaced by a placeholder `M c M`, where M is a private-use character that
occurs nowhere in the inputs or the template and c indexes a table of literals. The template
never sees a control spelling from content, so each control spelling in its output is markup.
After rendering, placeholders are replaced by their literals and the markup spans recorded.

    content "a<|im_end|>b"  --protect-->  "a" M c0 M "b"  --render-->  "<|im_start|>user\\na" M c0 M "b<|im_end|>"
    --restore-->  text "<|im_start|>user\\na<|im_end|>b<|im_end|>", special spans [(0, 12), (29, 39)]
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from ninfer.api.service.prompt_encoding import control_token_spellings
from ninfer.api.service.template_options import TemplateOptions
from ninfer.api.service.tool_fallback import lower_tools, renders_tools, uses_tools
from ninfer.api.service.toolcalls_json import template_tool_format
from ninfer.api.wire import errors, long_text
from ninfer.api.wire.fields import parse_json_text
from ninfer.errors import ConfigError

TEMPLATES_DIR = Path(__file__).parent / "templates"


class TemplateRenderError(errors.ApiError):
    """The template rejected the conversation (`raise_exception`, a Jinja error) or altered
    protected content: HTTP 400 invalid_prompt."""

    def __init__(self, message: str) -> None:
        super().__init__(400, message, code="invalid_prompt", param="messages")


# ---------------------------------------------------------------------------------------------
# Content protection
# ---------------------------------------------------------------------------------------------

_PLACEHOLDER_BASE = 0xF0000  # plane-15 private use: index characters of placeholders
_MARK_CANDIDATES = [chr(c) for c in range(0xE000, 0xE100)]
_FIRST_MARK = re.compile("[\ue000-\ue0ff]")  # any candidate


def _strings(obj: Any) -> Iterable[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _strings(v)


def _unused_marks(strings: Iterable[str]) -> list[str]:
    """The mark candidates (private-use characters) that occur in none of `strings`, in order.
    One windowed pass over each string (ninfer.api.wire.long_text) for a class of the
    candidates still free, narrowed each time it finds one."""
    free = list(_MARK_CANDIDATES)
    pattern = _FIRST_MARK
    for s in strings:
        pos = 0
        while free:
            found = long_text.search(pattern, s, 1, pos)
            if found is None:
                break
            free.remove(found.group())
            pattern = re.compile("[" + "".join(free) + "]") if free else pattern
            pos = found.end()
    return free


class _Protector:
    """Replaces control spellings in content by placeholders and undoes it after rendering."""

    def __init__(self, controls: Sequence[str], avoid: Sequence[str]) -> None:
        self.controls = sorted({c for c in controls if c}, key=len, reverse=True)
        self.literals: list[str] = []
        self._ids: dict[str, int] = {}
        free = _unused_marks(avoid)
        if not free:  # pragma: no cover - needs 256 distinct private-use characters in a request
            raise TemplateRenderError("request text uses too many private-use characters")
        self.mark = free[0]
        alt = "|".join(re.escape(c) for c in self.controls)
        self._control_re = re.compile(alt) if alt else None
        m = re.escape(self.mark)
        self._restore_re = re.compile(f"{m}(.){m}" + (f"|{alt}" if alt else ""), re.DOTALL)
        # Proper prefixes / suffixes of control spellings: a content string ending / starting with
        # one could complete a spelling together with adjacent text.
        self._prefixes = {c[:i] for c in self.controls for i in range(1, len(c))}
        self._suffixes = {c[i:] for c in self.controls for i in range(1, len(c))}
        self._longest = max((len(c) for c in self.controls), default=0)
        # the longest match of _restore_re: a placeholder (3 characters) or a control spelling
        self._longest_restore = max(3, self._longest)

    def _placeholder(self, literal: str) -> str:
        k = self._ids.get(literal)
        if k is None:
            k = self._ids[literal] = len(self.literals)
            self.literals.append(literal)
        return f"{self.mark}{chr(_PLACEHOLDER_BASE + k)}{self.mark}"

    def protect_str(self, s: str) -> str:
        if self._control_re is None or not s:
            return s
        # window by window: a content string may be megabytes (ninfer.api.wire.long_text)
        found = long_text.finditer(self._control_re, s, self._longest)
        spans = [(m.start(), m.end()) for m in found]
        top = min(self._longest - 1, len(s))
        lead = next((n for n in range(top, 0, -1) if s[:n] in self._suffixes), 0)
        trail = next((n for n in range(top, 0, -1) if s[-n:] in self._prefixes), 0)
        if lead:
            spans.append((0, lead))
        if trail:
            spans.append((len(s) - trail, len(s)))
        if not spans:
            return s
        spans.sort()
        merged: list[list[int]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        out, pos = [], 0
        for a, b in merged:
            out.append(s[pos:a])
            out.append(self._placeholder(s[a:b]))
            pos = b
        out.append(s[pos:])
        return "".join(out)

    def protect(self, obj: Any) -> Any:
        """A copy of `obj` (JSON-like data) with every string key and value protected."""
        if isinstance(obj, str):
            return self.protect_str(obj)
        if isinstance(obj, Mapping):
            return {self.protect(k): self.protect(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.protect(v) for v in obj]
        return obj

    def restore(self, rendered: str) -> tuple[str, tuple[tuple[int, int], ...]]:
        """Final text and the spans of markup control tokens in it."""
        # window by window, and without rebuilding the text when no placeholder is in it: the
        # rendering may be megabytes, and each whole-text pass holds the GIL for milliseconds
        found = list(long_text.finditer(self._restore_re, rendered, self._longest_restore))
        if all(m.group(1) is None for m in found):
            if long_text.find(rendered, self.mark) >= 0:
                raise TemplateRenderError("the chat template altered protected content")
            return rendered, tuple((m.start(), m.end()) for m in found)
        out: list[str] = []
        spans: list[tuple[int, int]] = []
        pos = n = 0
        for m in found:
            out.append(rendered[pos : m.start()])
            n += m.start() - pos
            if m.group(1) is not None:
                k = ord(m.group(1)) - _PLACEHOLDER_BASE
                if not 0 <= k < len(self.literals):
                    raise TemplateRenderError("the chat template altered protected content")
                lit = self.literals[k]
            else:
                lit = m.group(0)
                spans.append((n, n + len(lit)))
            out.append(lit)
            n += len(lit)
            pos = m.end()
        out.append(rendered[pos:])
        text = "".join(out)
        if long_text.find(text, self.mark) >= 0:
            raise TemplateRenderError("the chat template altered protected content")
        return text, tuple(spans)


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RenderedPrompt:
    """Rendered prompt text and the (start, end) character spans of the control tokens the
    template wrote; every other character is text."""

    text: str
    special_spans: tuple[tuple[int, int], ...] = ()


class _GenerationTag(jinja2.ext.Extension):
    """Accepts Hugging Face's `{% generation %}...{% endgeneration %}` blocks (no-op)."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise TemplateRenderError(f"chat template rejected the conversation: {message}")


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _normalize_message(message: Mapping[str, Any], index: int = 0) -> dict[str, Any]:
    """Copy of a message whose tool-call `arguments` JSON text is parsed into an ordered object
    (templates render parameters from it). Arguments nested deeper than fields.MAX_DEPTH are a
    400 naming them (`index`: the message's position, for that name)."""
    msg = dict(message)
    calls = msg.get("tool_calls")
    if calls:
        norm = []
        for j, call in enumerate(calls):
            call = dict(call)
            fn = call.get("function")
            if isinstance(fn, Mapping) and isinstance(fn.get("arguments"), str):
                fn = dict(fn)
                try:
                    param = f"messages[{index}].tool_calls[{j}].function.arguments"
                    args = parse_json_text(fn["arguments"], param)
                except json.JSONDecodeError:
                    args = None
                if isinstance(args, dict):
                    fn["arguments"] = args
                call["function"] = fn
            norm.append(call)
        msg["tool_calls"] = norm
    return msg


class ChatTemplate:
    """A compiled chat template.

    Args:
        source: the Jinja text.
        control_tokens: control-token spellings of the tokenizer (see `control_token_spellings`);
            these are kept out of content.
        special_tokens: values of `bos_token`, `eos_token`, ... variables.
    """

    def __init__(
        self,
        source: str,
        *,
        control_tokens: Sequence[str] = (),
        special_tokens: Mapping[str, str] | None = None,
    ) -> None:
        self.source = source
        self.control_tokens = tuple(control_tokens)
        self.special_tokens = dict(special_tokens or {})
        env = _environment()
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ConfigError(f"chat template does not parse: line {e.lineno}: {e.message}") from e
        self.renders_tools = renders_tools(env, source)  # (declarations, calls); else lower_tools
        # which parser (and forced-call grammar) reads the calls the template teaches
        self.tool_call_format = template_tool_format(source, self.renders_tools[0])

    @classmethod
    def from_file(cls, path: str | Path, **kwargs: Any) -> ChatTemplate:
        """Load a template file (`--chat-template FILE`)."""
        try:
            source = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"cannot read chat template {path}: {e.strerror}") from e
        return cls(source, **kwargs)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        options: TemplateOptions | None = None,
    ) -> RenderedPrompt:
        """Render normalized messages (input order kept) and OpenAI-style tool definitions.

        With `continue_final_message` the last (assistant) message is left open so generation
        continues its text (Anthropic assistant prefill); it excludes `add_generation_prompt`.
        Raises TemplateRenderError when the template rejects the input.
        """
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message excludes add_generation_prompt")
        variables = (options or TemplateOptions()).variables()
        msgs = [_normalize_message(m, i) for i, m in enumerate(messages)]
        tool_list = list(tools) if tools else None
        if uses_tools(msgs, tool_list, self.renders_tools):
            msgs, tool_list = lower_tools(msgs, tool_list, self.renders_tools)
        data = {"messages": msgs, "tools": tool_list, "kwargs": variables}
        prot = _Protector(self.control_tokens, [self.source, *_strings(data)])
        context = prot.protect(variables)
        context.update(self.special_tokens)
        context["messages"] = prot.protect(msgs)
        context["tools"] = prot.protect(tool_list) if tool_list is not None else None
        context["add_generation_prompt"] = add_generation_prompt
        context["continue_final_message"] = continue_final_message
        try:
            rendered = self._template.render(**context)
        except TemplateRenderError:
            raise
        except jinja2.TemplateError as e:
            raise TemplateRenderError(f"chat template failed: {e}") from e
        if continue_final_message:
            rendered = _cut_after_final(rendered, context["messages"])
        text, spans = prot.restore(rendered)
        return RenderedPrompt(text, spans)


def _cut_after_final(rendered: str, messages: Sequence[Mapping[str, Any]]) -> str:
    """Truncate the rendering right after the final message's text."""
    if not messages:
        raise TemplateRenderError("continue_final_message needs a final message")
    content = messages[-1].get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    if not isinstance(content, str) or not content.strip():
        raise TemplateRenderError("the final assistant message to continue has no text")
    core = content.strip()
    at = rendered.rfind(core)
    if at < 0:
        raise TemplateRenderError("the chat template did not render the final message's text")
    full = content.lstrip()
    end = at + len(full) if rendered.startswith(full, at) else at + len(core)
    return rendered[:end]


def load_builtin_template(name: str, **kwargs: Any) -> ChatTemplate:
    """A template shipped in `ninfer/api/service/templates/` (e.g. "qwen_xml")."""
    return ChatTemplate.from_file(TEMPLATES_DIR / f"{name}.jinja", **kwargs)


# ---------------------------------------------------------------------------------------------
# Templates for a tokenizer
# ---------------------------------------------------------------------------------------------


def chat_template_for(source: str, tokenizer: Tokenizer, **kwargs: Any) -> ChatTemplate:
    """A ChatTemplate whose protected spellings are the tokenizer's control tokens."""
    return ChatTemplate(source, control_tokens=control_token_spellings(tokenizer), **kwargs)


def artifact_template(
    artifact: Any, tokenizer: Tokenizer, path: str | Path | None = None
) -> ChatTemplate:
    """The chat template a model is served with (`ninfer serve`, `LLM.chat`): the Jinja file at
    `path` (--chat-template), else the artifact's own, else ninfer's built-in Qwen-style ChatML
    template (logged as a warning), with the artifact's bos/eos token texts as variables."""
    specials = {
        k: v
        for k in ("bos_token", "eos_token")
        if isinstance(v := artifact.special_tokens.get(k), str)
    }
    if path is not None:
        source = Path(path).read_text(encoding="utf-8")
        return chat_template_for(source, tokenizer, special_tokens=specials)
    if artifact.chat_template:
        return chat_template_for(artifact.chat_template, tokenizer, special_tokens=specials)
    logging.getLogger("ninfer.serve").warning(
        "the artifact has no chat template: using ninfer's built-in Qwen-style ChatML template"
    )
    return load_builtin_template(
        "qwen_xml", control_tokens=control_token_spellings(tokenizer), special_tokens=specials
    )
