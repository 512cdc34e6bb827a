"""The walk of a lookup (:func:`bridge.readsets.read_sets.follow`): the entry under the key whose
reads find what they found, else the one under the key chained from what they find now; a chain
of entries whose reads all find something else (hostile, or many versions) ends after a bounded
number of reads, with nowhere to store (the kernel is kept in memory)."""

from __future__ import annotations

from bridge.readsets import read_sets

KEY = "a" * 64


def walk(entries: dict[str, str], finds: str) -> tuple[tuple[str | None, str | None], list[str]]:
    """Follow from KEY through ``entries`` (key -> what its reads found), the reads finding
    ``finds`` now; with the keys read."""
    read: list[str] = []

    def entry(key: str) -> str | None:
        read.append(key)
        return entries.get(key)

    def judge(_: str, found: str) -> read_sets.Verdict:
        fresh = found == finds
        return read_sets.Verdict(read_sets.FRESH) if fresh else read_sets.Verdict("changed", finds)

    return read_sets.follow(KEY, entry, judge), read


def test_an_entry_whose_reads_find_what_they_found_is_used():
    assert walk({KEY: "v1"}, "v1") == ((KEY, "v1"), [KEY])


def test_a_stale_entry_leads_to_the_key_chained_from_what_the_reads_find_now():
    chained = read_sets.chained(KEY, "v2")
    assert chained not in (KEY, read_sets.chained(KEY, "v3"))
    assert chained == read_sets.chained(KEY, "v2")  # the same in every process
    assert walk({KEY: "v1"}, "v2") == ((chained, None), [KEY, chained])  # stored there
    assert walk({KEY: "v1", chained: "v2"}, "v2") == ((chained, "v2"), [KEY, chained])


def test_a_chain_of_stale_entries_ends_after_a_bounded_number_of_reads():
    entries, key = {}, KEY
    for _ in range(50):  # (a writer could make the chain as long as it likes)
        entries[key] = "v1"
        key = read_sets.chained(key, "v2")
    found, read = walk(entries, "v2")
    assert found == (None, None)
    assert len(read) == read_sets.MAX_HOPS + 1
