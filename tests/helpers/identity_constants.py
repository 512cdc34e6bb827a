"""Constants of the kinds a constexpr can be (numbers, strings, tuples, lists, enums,
dataclasses, classes made by a function, lambdas, sets), each unlike the others: for the
tests of how ``bridge.identity.jit`` describes them, here and in child processes."""

from __future__ import annotations

import dataclasses
import enum


class Color(enum.Enum):
    RED = 1
    BLUE = 2


@dataclasses.dataclass(frozen=True)
class Tile:
    m: int
    n: int


def maker(value):
    class Made:
        def get(self):
            return value

    return Made


DISTINCT = [
    1,
    True,
    1.0,
    "1",
    (1,),
    [1],
    Color.RED,
    Color.BLUE,
    Tile(16, 32),
    Tile(32, 16),
    maker(1),
    maker(2),
    lambda: 1,
    lambda: 2,
    frozenset({"a"}),
]
