"""The runtime side of image and video input.

- `mrope`: the 3-axis (temporal, height, width) positions of a prompt with media, from its
  `MediaSpan`s (plain Python: the scheduler builds them).
- `placeholders`: `check_media`, the engine's submission check of a request's spans.
- `geometry`: the vision tower's host inputs of one item (interpolation taps, 2-D rotary
  positions, attention segments) from its grid.
- `ops`: the torch kernels of the vision ops (`torch.<op>` in cpu plans).
- `encoder`: runs the plan's vision stage per item and hands each step the embeddings of the
  placeholder rows it computes.

Only `mrope` and `placeholders` are imported by torch-free code; this package's `__init__` imports nothing.
"""
