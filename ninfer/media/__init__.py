"""Image and video input: acquiring media safely and preparing it for the vision tower.

- `errors`: `MediaError` and the codes the API reports (invalid_media, media_budget_exceeded,
  media_fetch_failed, media_fetch_timeout).
- `addresses`: which IP addresses a fetch may reach (`FetchPolicy`, `refusal`).
- `fetch`: `HttpFetcher`, the server-side request forgery boundary for http(s) sources.
- `source`: `acquire`, the bytes of a data: URI or an http(s) URL.

Nothing here imports the API or the engine: the protocol layer turns a `MediaError` into its
HTTP error and attaches the request field.
"""
