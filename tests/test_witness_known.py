"""A `FileWitness` reuses the heads it decoded only while the file holds exactly the bytes it last read or wrote:
an edit between two writes is judged as a fresh reader judges it."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_witness_file import NAME, _reslot, head, the_file

from trioloop.durable.journal import JournalError
from trioloop.durable.signing import JournalSigner
from trioloop.durable.witness import FileWitness


def test_writes_in_a_row_keep_the_newest_head_and_an_edit_is_refused(tmp_path: Path) -> None:
    signer = JournalSigner.generate()
    witness = FileWitness(tmp_path, signer=signer)
    for seq in range(1, 8):
        witness.witness_now(head(seq))
        assert FileWitness(tmp_path, signer=signer)._read(NAME) == head(seq)
    witness.witness_now(head(5))  # older: never replaces, known slots or not
    assert FileWitness(tmp_path, signer=signer)._read(NAME) == head(7)
    _reslot(the_file(witness), lambda value: {**value, "seq": 3})  # an edit the journal key did not make
    with pytest.raises(JournalError, match="was edited"):
        witness.witness_now(head(8))
    with pytest.raises(JournalError, match="was edited"):
        witness._read(NAME)
