"""Tools for a chat template that renders none (SmolLM2's ChatML): the declarations, calls and
results reach the prompt in the text of ninfer's Qwen XML template, and the calls written there
parse back as the same calls."""

from __future__ import annotations

import json

from tokenizers import Tokenizer

from ninfer.api.service.generation import ToolCallDone
from ninfer.api.service.template import ChatTemplate, chat_template_for, load_builtin_template
from ninfer.api.service.toolcalls import ToolCallParser

# SmolLM2-135M-Instruct's template (the demo model): every role as it is, no tools
PLAIN_CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 2})},
}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "22 C"},
]


def _plain(tok: Tokenizer) -> ChatTemplate:
    return chat_template_for(PLAIN_CHATML, tok)


def test_template_without_tools_gets_them_in_qwen_xml_text(qwen_tokenizer: Tokenizer) -> None:
    plain = _plain(qwen_tokenizer)
    assert plain.renders_tools == (False, False)
    text = plain.render(HISTORY, tools=[WEATHER]).text
    qwen = load_builtin_template("qwen_xml")
    assert qwen.renders_tools == (True, True)
    reference = qwen.render(HISTORY, tools=[WEATHER]).text
    # the same tool block, call markup and result turn as the Qwen XML template writes
    tools_block = reference[reference.index("# Tools") : reference.index("<|im_end|>")]
    assert text.startswith("<|im_start|>system\n" + tools_block + "<|im_end|>\n")
    start = reference.index("<tool_call>\n<function=get_weather>")
    call = reference[start : reference.index("</tool_call>", start) + len("</tool_call>")]
    assert "<|im_start|>assistant\nLet me check.\n\n" + call + "<|im_end|>\n" in text
    results = "<tool_response>\nsunny\n</tool_response>\n<tool_response>\n22 C\n</tool_response>"
    assert "<|im_start|>user\n" + results + "<|im_end|>\n" in text
    assert "<|im_start|>tool" not in text
    assert text.endswith("<|im_start|>assistant\n")


def test_written_calls_parse_back(qwen_tokenizer: Tokenizer) -> None:
    text = _plain(qwen_tokenizer).render(HISTORY, tools=[WEATHER]).text
    start = text.index("<tool_call>\n<function=get_weather>")
    markup = text[start : text.index("</tool_call>", start) + len("</tool_call>")]
    parser = ToolCallParser([WEATHER])
    events = parser.feed(markup) + parser.finish()
    (done,) = [e for e in events if isinstance(e, ToolCallDone)]
    assert done.call.name == "get_weather"
    assert json.loads(done.call.arguments) == {"city": "Paris", "days": 2}


def test_system_message_keeps_its_text_before_the_tools(qwen_tokenizer: Tokenizer) -> None:
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = _plain(qwen_tokenizer).render(msgs, tools=[WEATHER]).text
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert text.count("<|im_start|>system") == 1


def test_without_tools_nothing_changes(qwen_tokenizer: Tokenizer) -> None:
    msgs = [{"role": "user", "content": "Hi"}]
    plain = _plain(qwen_tokenizer)
    assert plain.render(msgs).text == plain.render(msgs, tools=None).text
    assert "# Tools" not in plain.render(msgs).text
    assert "# Tools" in plain.render(msgs, tools=[WEATHER]).text


def test_template_with_calls_but_no_declarations_keeps_its_calls(qwen_tokenizer: Tokenizer) -> None:
    source = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
        "{% for c in m.tool_calls or [] %}[{{ c.function.name }}]{% endfor %}<|im_end|>\n"
        "{% endfor %}"
    )
    tpl = chat_template_for(source, qwen_tokenizer)
    assert tpl.renders_tools == (False, True)
    text = tpl.render(HISTORY, tools=[WEATHER], add_generation_prompt=False).text
    assert text.startswith("<|im_start|>system\n# Tools\n")  # the declarations it cannot read
    assert "Let me check.[get_weather]<|im_end|>" in text  # its own rendering of calls
    assert "<|im_start|>tool\nsunny<|im_end|>" in text  # and of results
