"""Which output tokens get log-probability entries, and when a stream hands them out: answer
tokens only (not reasoning, not a withheld EOS, not tool-call markup), each entry with the
content delta that shows its token, the stream's entries equal to the aggregate's. The values
come from the engine (tested against the model's logits in tests/runtime and tests/e2e);
here each token gets a distinct made-up value so that the order can be checked."""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer

from ninfer.api.service.generation import ContentText, Finished, GenerationRequest
from ninfer.api.service.logprob_entries import UNLIKELY, EntryFormatter
from ninfer.api.service.postprocess import PostProcessor
from ninfer.runtime.request import FinishEvent, Timings, TokenLogprob, Usage

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}


def run(
    tok: Tokenizer, text: str, *, thinking: bool = False, **req: Any
) -> tuple[list[ContentText], Finished, list[int]]:
    eos = tok.token_to_id("<|im_end|>")
    ids = [*tok.encode(text).ids, eos]
    post = PostProcessor(
        GenerationRequest(messages=[{"role": "user", "content": "q"}], logprobs=1, **req),
        tokenizer=tok,
        eos_ids=frozenset({eos}),
        prompt_len=3,
        starts_in_thinking=thinking,
        t_submit=0.0,
    )
    lps = tuple(TokenLogprob(t, -i / 100, ((t, -i / 100),)) for i, t in enumerate(ids))
    events = []
    for i in range(0, len(ids), 2):  # two tokens per engine event, as a stream gets them
        events += post.tokens(tuple(ids[i : i + 2]), logprobs=lps[i : i + 2])
        if post.stop_match is not None:
            break
    events += post.finish()
    done = FinishEvent("stop", Usage(3, len(ids)), Timings(0.0, 0.1, 0.1, 0.2, 0.3), tuple(ids))
    fin = post.finished(done, "max_tokens", prompt_only=False)
    return [e for e in events if isinstance(e, ContentText)], fin, ids


def joined(entries: Any) -> str:
    return b"".join(bytes(e["bytes"]) for e in entries).decode()


def test_plain_answer_every_token_but_eos_in_order(qwen_tokenizer: Tokenizer) -> None:
    deltas, fin, ids = run(qwen_tokenizer, "The answer is 42, of course.")
    assert fin.content == "The answer is 42, of course."
    assert joined(fin.logprobs) == fin.content  # EOS has no entry
    assert [e["logprob"] for e in fin.logprobs] == [-i / 100 for i in range(len(ids) - 1)]
    streamed = [e for d in deltas for e in d.logprobs]
    assert streamed == list(fin.logprobs)
    shown, released = "", []
    for d in deltas:  # by each delta, the entries out are of tokens the text shown completes
        shown += d.text
        released += d.logprobs
        assert shown.startswith(joined(released))
    top = fin.logprobs[0]["top_logprobs"]
    assert top == [{k: fin.logprobs[0][k] for k in ("token", "logprob", "bytes")}]


def test_reasoning_tokens_have_no_entries(qwen_tokenizer: Tokenizer) -> None:
    _, fin, _ = run(qwen_tokenizer, "<think>\nlet me see\n</think>\n\nIt is 42.")
    assert fin.reasoning.strip() == "let me see" and fin.content.strip() == "It is 42."
    assert joined(fin.logprobs).strip() == "It is 42."
    assert "see" not in joined(fin.logprobs) and "think" not in joined(fin.logprobs)
    _, fin, _ = run(qwen_tokenizer, "still thinking\n</think>\n\nDone.", thinking=True)
    assert joined(fin.logprobs).strip() == "Done."


def test_tool_call_markup_has_no_entries(qwen_tokenizer: Tokenizer) -> None:
    text = "Let me check.\n<tool_call>\n<function=get_weather>\n</function>\n</tool_call>"
    deltas, fin, _ = run(qwen_tokenizer, text, tools=[WEATHER])
    assert fin.reason == "tool_calls" and fin.content.strip() == "Let me check."
    assert joined(fin.logprobs).strip() == "Let me check."
    assert [e for d in deltas for e in d.logprobs] == list(fin.logprobs)


def test_stop_string_entries_end_at_the_token_that_completed_it(qwen_tokenizer: Tokenizer) -> None:
    deltas, fin, _ = run(qwen_tokenizer, "Numbers 1 2 3 4 5 6", stop=("4 5",))
    assert fin.content == "Numbers 1 2 3 "
    assert joined(fin.logprobs).endswith("4 5") and joined(fin.logprobs).startswith(fin.content)
    assert [e for d in deltas for e in d.logprobs] == list(fin.logprobs)


def test_split_characters_show_escaped_bytes(qwen_tokenizer: Tokenizer) -> None:
    _, fin, _ = run(qwen_tokenizer, "snow ☃ and 🎉 done")
    assert joined(fin.logprobs) == fin.content == "snow ☃ and 🎉 done"
    partial = [e for e in fin.logprobs if "\\x" in e["token"]]
    assert partial  # this tokenizer splits the emoji across byte tokens
    for e in partial:
        assert e["token"] == bytes(e["bytes"]).decode("utf-8", errors="backslashreplace")


def test_excluded_tokens_are_written_as_very_unlikely(qwen_tokenizer: Tokenizer) -> None:
    fmt = EntryFormatter(qwen_tokenizer)
    e = fmt.entry(TokenLogprob(5, -0.5, ((5, -0.5), (6, float("-inf")))))
    assert e["logprob"] == -0.5 and e["top_logprobs"][1]["logprob"] == UNLIKELY == -9999.0
