"""The pure turn machine: what decides, as functions over frozen values.

`reducer.reduce_turn` folds a turn's inputs (`inputs`: stream events and commands) into its `state.TurnState`,
consulting the transition `tables` and wording every notice from `texts`; `authorization` builds and checks
grants (`grants` holds the values), `limits` the bounds, `card` and `preview` what a reviewer sees, `canonical`
the digests a grant binds, `untrusted_text` the fencing of document and tool text, `tools` and `tool_input` what
the machine knows of a tool, `reservations` and `step_ids` the new ids a step's calls reserve, `document` the
interface a document type implements, `transaction` the commit and undo values.

No Trio, no I/O, no clock: this package imports only `trioloop.protocol`, so every property here is proved
with lists of inputs. Apps use it through `trioloop` and `trioloop.lowlevel`.
"""
