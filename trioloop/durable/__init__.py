"""What outlives a process: the journal of a turn's inputs (`journal`: entries, hash chain, the writer, replay),
the `store` protocol with its stores (`sqlite`, the embedded default; `postgres`, for fleets), `session_file`s,
`bounded_json` decoding for everything read back, atomic `files`, and the `audit` trail.

Imports `trioloop.machine` and `trioloop.protocol`, never the runtime: replay is the machine's own reducer run
over what was recorded. Stores are I/O: their blocking calls run in worker threads under their own limiter.
Apps use it through `trioloop`, `trioloop.stores` and `trioloop.audit`.
"""
