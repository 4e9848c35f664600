"""`FileWitness`'s file: two slots written in place, each with its own check.

A torn write (a crash in the middle of one) leaves the other slot, one head behind, never a false alarm; a
head is never replaced by an older one; files of the earlier JSON format are read and converted; a head longer
than a slot gets a file with larger slots.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trioloop.durable import witness as witness_module
from trioloop.durable.journal import JournalError
from trioloop.durable.witness import FileWitness, WitnessedHead

JOURNAL = "journal-1"


def head(seq: int, session: str = "s1") -> WitnessedHead:
    return WitnessedHead(journal=JOURNAL, session=session, seq=seq, hash=f"{seq:064x}")


def the_file(witness: FileWitness) -> Path:
    (path,) = [p for p in witness.folder.iterdir() if not p.name.startswith(".")]
    return path


def test_heads_are_written_in_place_and_the_newest_is_read(tmp_path: Path) -> None:
    witness = FileWitness(tmp_path)
    witness.witness_now(head(3))
    path = the_file(witness)
    inode = path.stat().st_ino
    for seq in (5, 9, 12):
        witness.witness_now(head(seq))
    assert witness._read(JOURNAL) == head(12)
    assert path.stat().st_ino == inode  # written in place: no new file, no rename
    assert (path.stat().st_mode & 0o777) == 0o600


def test_an_older_head_never_replaces_a_newer_one(tmp_path: Path) -> None:
    witness = FileWitness(tmp_path)
    witness.witness_now(head(10))
    witness.witness_now(head(12))
    before = the_file(witness).read_bytes()
    for seq in (4, 11, 12):
        witness.witness_now(head(seq))
    assert the_file(witness).read_bytes() == before
    assert witness._read(JOURNAL) == head(12)


def torn_pwrite(keep: int) -> Any:
    """An `os.pwrite` that writes only the first ``keep`` bytes, as a crash in the middle of the write leaves."""

    real = os.pwrite

    def pwrite(descriptor: int, data: bytes, offset: int) -> int:
        return real(descriptor, data[:keep], offset)

    return pwrite


@pytest.mark.parametrize("keep", [0, 1, 4, 30, 60, 130])
def test_a_torn_write_leaves_the_head_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: int) -> None:
    witness = FileWitness(tmp_path)
    witness.witness_now(head(1))
    witness.witness_now(head(2))
    with monkeypatch.context() as patch:
        patch.setattr(witness_module.os, "pwrite", torn_pwrite(keep))
        witness.witness_now(head(3))  # overwrites the slot of head 1, and is cut
    assert witness._read(JOURNAL) == head(2)  # one behind: never an error
    witness.witness_now(head(4))  # goes into the torn slot again: head 2 stays whole meanwhile
    assert witness._read(JOURNAL) == head(4)


def test_a_file_whose_slots_both_fail_their_check_is_refused(tmp_path: Path) -> None:
    witness = FileWitness(tmp_path)
    witness.witness_now(head(1))
    witness.witness_now(head(2))
    path = the_file(witness)
    data = bytearray(path.read_bytes())
    start = len(witness_module._MAGIC) + 4
    for slot in (0, 1):
        data[start + slot * witness_module._SLOT + 20] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(JournalError, match="not a witnessed head"):
        witness._read(JOURNAL)
    with pytest.raises(JournalError, match="not a witnessed head"):
        witness.witness_now(head(3))
    path.write_bytes(b"{}")
    with pytest.raises(JournalError, match="not a witnessed head"):
        witness._read(JOURNAL)


def test_a_file_of_another_journal_is_refused(tmp_path: Path) -> None:
    witness = FileWitness(tmp_path)
    witness.witness_now(WitnessedHead(journal="other", session="s1", seq=5, hash="ab"))
    other = the_file(witness)
    other.rename(witness._path(JOURNAL))  # a file copied over another journal's
    with pytest.raises(JournalError, match="not a witnessed head"):
        witness._read(JOURNAL)


def test_an_earlier_json_file_is_read_and_converted_at_the_next_write(tmp_path: Path) -> None:
    witness = FileWitness(tmp_path)
    legacy = witness._path(JOURNAL, ".json")
    legacy.write_text(json.dumps({"journal": JOURNAL, "session": "s1", "seq": 7, "hash": f"{7:064x}"}))
    assert witness._read(JOURNAL) == head(7)
    witness.witness_now(head(5))  # older than the JSON file's head: that head is kept
    assert not legacy.exists() and witness._path(JOURNAL).exists()
    assert witness._read(JOURNAL) == head(7)
    witness.witness_now(head(8))
    assert witness._read(JOURNAL) == head(8)
    legacy.write_text("not json")
    assert witness._read(JOURNAL) == head(8)  # once converted, the new file is the one read


def test_a_head_longer_than_a_slot_gets_a_file_with_larger_slots(tmp_path: Path) -> None:
    witness = FileWitness(tmp_path)
    witness.witness_now(head(1))
    long = head(2, session="s" * 5000)
    witness.witness_now(long)
    assert witness._read(JOURNAL) == long
    witness.witness_now(head(3))
    assert witness._read(JOURNAL) == head(3)
    witness.witness_now(head(4, session="t" * 5000))
    assert witness._read(JOURNAL) == head(4, session="t" * 5000)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    writes=st.lists(
        st.tuples(st.integers(min_value=1, max_value=60), st.none() | st.integers(min_value=0, max_value=120)),
        min_size=1,
        max_size=25,
    )
)
def test_the_newest_head_whole_written_is_always_read(tmp_path_factory: pytest.TempPathFactory, writes: Any) -> None:
    """For all sequences of heads, some of them torn (cut after a number of bytes): the head read is the
    newest one written whole, or newer (never older, never an error)."""
    witness = FileWitness(tmp_path_factory.mktemp("w"))
    whole = 0
    real_pwrite = os.pwrite
    for seq, cut in writes:
        if cut is None:
            witness.witness_now(head(seq))
            whole = max(whole, seq)
        else:
            witness_module.os.pwrite = torn_pwrite(cut)  # type: ignore[attr-defined]
            try:
                witness.witness_now(head(seq))
            finally:
                witness_module.os.pwrite = real_pwrite  # type: ignore[attr-defined]
        read = witness._read(JOURNAL)
        assert read is not None
        assert read.seq >= whole and read == head(read.seq)
