"""Scripts that build ninfer's test and demo artifacts, and small committed fixtures.

- `artifacts.tokenizer`: a tiny byte-level BPE tokenizer with the Qwen special tokens.
- `artifacts.fixtures`: tiny random Llama / Qwen3 / Qwen3-MoE / Qwen3.5 (dense, MoE) models,
  saved as Hugging Face directories and converted to `.ninfer` (`python -m artifacts.fixtures`).
- `artifacts.train_tiny`: trains the committed `fixtures/tiny-agent.ninfer` on a scripted corpus
  (`artifacts.agent_corpus`) so that it thinks and calls tools.
"""
