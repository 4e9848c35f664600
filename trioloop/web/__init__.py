"""The web faces: the review inbox (`trioloop serve`), which lists the reviews waiting in a journal store and posts
reviewers' signed decisions to its decision box, and the worker fleet (`trioloop worker`).

An optional extra (``pip install "trioloop[web]"``: Starlette, Hypercorn, Jinja2); the core never imports it. The
inbox's modules, from the top: `serve` (the command, on Hypercorn's Trio worker), `app` (the Starlette app: routes,
checks, decisions), `pages` (what each page shows), `events` (live updates), `inbox` (what waits, read from the
store and verified), `reviewers` (who may decide: the reviewers file, logins, cookies, CSRF, rate limits) and
`display` (untrusted text made visible and bounded).
"""
