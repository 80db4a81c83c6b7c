"""``store.rows.KeptConversions``: records kept between reads, never for a changed row."""

from __future__ import annotations

from operator import itemgetter

from corral.store.rows import KeptConversions

# whole rows: (key, written once, may change); the changeable part: (key, may change)
WHOLE = {"a": ("a", "spec-a", 1), "b": ("b", "spec-b", 1), "c": ("c", "spec-c", 1)}


def converted() -> KeptConversions[dict[str, object]]:
    return KeptConversions(lambda row: {"row": tuple(row)}, itemgetter(0, 2))


def read(kept, parts, whole, asked):
    def whole_rows(keys):
        asked.append(list(keys))
        return [whole[key] for key in keys if key in whole]

    reading = kept.read()
    records = reading.records(parts, whole_rows)
    reading.finish()
    return records


def test_only_changed_or_new_rows_are_read_whole_and_converted():
    kept = converted()
    asked: list[list[str]] = []
    first = read(kept, [("a", 1), ("b", 1)], WHOLE, asked)
    assert [record["row"] for record in first] == [WHOLE["a"], WHOLE["b"]]
    second = read(kept, [("a", 1), ("b", 2), ("c", 1)], {**WHOLE, "b": ("b", "spec-b", 2)}, asked)
    assert asked == [["a", "b"], ["b", "c"]]
    assert second[0] is first[0]
    assert second[1]["row"] == ("b", "spec-b", 2) and second[2]["row"] == WHOLE["c"]


def test_a_row_gone_before_its_whole_read_is_left_out_and_one_changed_meanwhile_is_taken_as_read():
    kept = converted()
    asked: list[list[str]] = []
    # "a" left the query between the two reads; "b" changed again: its whole row says 3
    records = read(kept, [("a", 1), ("b", 2)], {"b": ("b", "spec-b", 3)}, asked)
    assert [record["row"] for record in records] == [("b", "spec-b", 3)]
    # kept by what the record was made from: parts (b, 3) reuse it, parts (b, 2) do not
    again = read(kept, [("b", 3)], {}, asked)
    assert again[0] is records[0]
    assert read(kept, [("b", 2)], {"b": ("b", "spec-b", 2)}, asked)[0]["row"] == ("b", "spec-b", 2)


def test_whole_rows_without_parts_compare_whole_and_drop_what_a_read_did_not_meet():
    kept: KeptConversions[dict[str, object]] = KeptConversions(lambda row: {"row": tuple(row)})
    reading = kept.read()
    first = reading.records([("a", 1), ("b", 1)])
    reading.finish()
    reading = kept.read()
    second = reading.records([("a", 1)])
    reading.finish()
    assert second[0] is first[0]
    reading = kept.read()
    third = reading.records([("a", 1), ("b", 1)])
    reading.finish()
    assert third[0] is first[0] and third[1] is not first[1] and third[1] == first[1]
