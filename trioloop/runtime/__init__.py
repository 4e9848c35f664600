"""The Trio shell: what waits. `run_turn` drives one turn (its scopes, its inbox and single consumer), with the
person-waits part (review, questions, sampling, the paused deadline), tool execution (start, finish, commit),
provider requests and retries, and the deadline `sharpener`; `Session` holds a conversation across turns and
owns the nursery its tools live in; `observer` is how the world outside watches.

It performs only the effects the machine's state asks for and decides nothing about authorization. Imports
`trioloop.machine`, `trioloop.durable`, `trioloop.protocol` and `trioloop.providers`; apps use it through
`trioloop`.
"""
