"""The engine core's side of image and video input (plain Python, no torch).

- `mrope`: the 3-axis (temporal, height, width) positions of a prompt with media, from its
  `MediaSpan`s (the scheduler builds them).
- `placeholders`: `check_media`, the engine's submission check of a request's spans.

The tensor side (the vision tower's host inputs, its torch kernels and the per-item encoder)
lives with the executors, in `ninfer.runtime.executors.vision`.
"""
