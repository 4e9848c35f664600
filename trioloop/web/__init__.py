"""The review inbox (`trioloop serve`): a web face that lists the reviews waiting in a journal store and posts
reviewers' signed decisions to its decision box.

An optional extra (``pip install "trioloop[web]"``: Starlette, Hypercorn, Jinja2); the core never imports it. The
modules, from the top: `serve` (the command: Hypercorn's Trio worker), `app` (the Starlette app and its pages),
`reviewers` (who may decide: the reviewers file, logins, cookies, CSRF, rate limits) and `inbox` (what waits, read
from the store and verified).
"""
