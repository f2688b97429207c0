"""The executors' side of image and video input.

- `geometry`: the vision tower's host inputs of one item (interpolation taps, 2-D rotary
  positions, attention segments) from its grid.
- `ops`: the torch kernels of the vision ops (`torch.<op>` in cpu plans); `cuda_ops` the CUDA
  executor's.
- `encoder`: runs the plan's vision stage per item and hands each step the embeddings of the
  placeholder rows it computes.

This package's `__init__` imports nothing.
"""
