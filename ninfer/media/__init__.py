"""Image and video input: acquiring media safely and preparing it for the vision tower.

- `errors`: `MediaError` and the codes the API reports (invalid_media, media_budget_exceeded,
  media_fetch_failed, media_fetch_timeout).
- `addresses`: which IP addresses a fetch may reach (`FetchPolicy`, `refusal`).
- `fetch`: `HttpFetcher`, the server-side request forgery boundary for http(s) sources.
- `source`: `acquire`, the bytes of a data: URI or an http(s) URL.
- `config`: `VisionPreprocessConfig`, the processor settings (from the model's processor files).
- `patches`: smart resize, normalisation and the patch-row layout; `PreparedMedia`.
- `image`, `video`: bytes -> `PreparedMedia`, matching transformers' Qwen3-VL / Qwen3.5 processors.
- `pool`: `PreprocessPool`, the bounded worker threads (--media-preprocess-threads).
- `cache`: `MediaCache`, single-flight builds, LRU retention (--media-cache-mib) and the live
  account (--media-live-mib), handing out `MediaRef`s.
- `preparer`: `MediaPreparer`, a request's media end to end behind the preparation gate.

Counters for /metrics and the request log live on the objects that count them:
`HttpFetcher.stats`, `PreprocessPool.stats`, `MediaCache.snapshot()`, `PreparationGate.waits`,
and per item `preparer.ItemStats`.

Nothing here imports the API or the engine: the protocol layer turns a `MediaError` into its
HTTP error and attaches the request field.
"""
