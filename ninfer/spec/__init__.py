"""Speculative decoding: drafters that propose tokens, and the verification that accepts them.

    drafter.py      the `Drafter` interface: propose up to k tokens per row (and the
                    distribution each was drawn from)
    draft_model.py  `--spec draft --draft-model ARTIFACT`: a separate small model with the same
                    tokenizer, on its own executor and KV pages
    mtp.py          `--spec mtp`: the artifact's MTP head (its own plan and KV pages) drafting from
                    the target's hidden states, which the engine hands it after every step
    draft_vocab.py  `--lm-head-draft`: the reduced, frequency-ranked draft LM head
    dflash.py       `--spec dflash`: the DFlash drafter (the artifact's dflash component), one
                    block forward per round over context K/V it builds from the target's
                    hidden states, which the engine hands it after every step
    dflash_model.py the DFlash drafter's forward in the published model's math
    verify.py       greedy verification and rejection sampling over the target's k + 1 logits
    speculator.py   one speculative step of the engine: window, propose, widen, ONE target
                    forward, verify
    build.py        the drafter `build_engine` attaches for EngineOptions.spec

The scheduler side (verify chunks, committing the accepted prefix, rejected pages) is
ninfer/runtime/speculation.py.
"""
