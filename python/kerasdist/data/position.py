"""Where a resumed stream of make_dataset's file or tf.data source starts, found without reading
the records before it: the reader's position computed from what make_dataset knows already (the
records in each file, the source's length, each epoch's order of files).

A file source's records come out of tf.data's interleave over the epochs' stream of file names:
`cycle` files open at once, one record from each in turn; a file that ends gives its place to the
next name when its turn comes round again. `interleave_position` runs that rule over the files'
record counts (the same rule tf.data's interleave follows, deterministic or parallel; a test pins
them equal) and returns what is open at a position: each open file's records read, and whose turn
is next. A new interleave over those files, in turn order from the next, each skipping the records
it had read, then the names after them, continues the stream exactly; only the open files (at most
`cycle`) are read again from their start, none of the files before."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class InterleavePosition:
    """The interleave after some records: `open_files` in the order of their next turns, each as
    (name number in the stream, records read from it), then the names from `next_name` on."""

    open_files: tuple[tuple[int, int], ...]
    next_name: int


def interleave_position(count_of: Callable[[int], int], cycle: int, records: int) -> InterleavePosition:
    """The position after `records` records of an interleave (block length 1, `cycle` files at
    once) over an endless stream of names, where `count_of(q)` is the q-th name's record count."""
    slots: list[list[int] | None] = [None] * cycle  # each [name number, records read, records]
    turn = next_name = 0
    left = records
    while left:
        slot = slots[turn]
        if slot is None:  # a free place is filled at its turn, before it gives a record
            slots[turn] = [next_name, 0, count_of(next_name)]
            next_name += 1
        elif slot[1] < slot[2]:
            rounds = _whole_rounds(slots, left)
            if rounds:
                for other in slots:
                    other[1] += rounds
                left -= rounds * cycle
                continue
            slot[1] += 1
            left -= 1
            turn = (turn + 1) % cycle
        else:  # an ended file leaves its place at its turn, which passes on without a record
            slots[turn] = None
            turn = (turn + 1) % cycle
    open_files = []
    for slot in slots[turn:] + slots[:turn]:
        if slot is None:  # a free place takes the next name at its turn, as a new interleave would
            open_files.append((next_name, 0))
            next_name += 1
        else:
            open_files.append((slot[0], slot[1]))
    return InterleavePosition(tuple(open_files), next_name)


def _whole_rounds(slots: list, left: int) -> int:
    """Rounds every open file can give a record in (no place free or ended): taken at once."""
    if any(slot is None for slot in slots):
        return 0
    return min(min(slot[2] - slot[1] for slot in slots), left // len(slots))


@dataclass(frozen=True)
class StreamPosition:
    """A repeated source of `n` records at record `records`: its pass, and the record in it."""

    epochs: int
    within: int


def stream_position(n: int, records: int) -> StreamPosition:
    return StreamPosition(*divmod(records, n))
