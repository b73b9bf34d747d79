"""Where each step of a workflow run's graph is drawn: columns by dependency depth, edges as curves (no I/O).

The page draws the result as inline SVG: no script lays anything out in the browser.
A step sits one column right of the deepest step it waits for; within a column,
steps are ordered by where their prerequisites sit (the mean of their rows), which
keeps most edges from crossing, and otherwise keep the run's order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Optional, Protocol, Sequence, TypeVar, Union

#: Sizes in SVG user units (CSS pixels at 100%).
NODE_WIDTH = 184
NODE_HEIGHT = 58
COLUMN_GAP = 64
ROW_GAP = 16
MARGIN = 8


class Step(Protocol):
    """What the layout reads of a step: its key and the keys of the steps it waits for."""

    @property
    def key(self) -> str: ...

    @property
    def deps(self) -> Sequence[str]: ...


S = TypeVar("S", bound=Step)


@dataclass(frozen=True)
class Node(Generic[S]):
    """A step and the top-left corner of its box."""

    step: S
    column: int
    x: int
    y: int


@dataclass(frozen=True)
class Edge:
    """A line from a prerequisite's box to its dependent's: ``path`` is SVG path data."""

    source: str
    target: str
    path: str


@dataclass(frozen=True)
class Layout(Generic[S]):
    nodes: tuple[Node[S], ...]
    edges: tuple[Edge, ...]
    width: int
    height: int


def depths(steps: Sequence[Step]) -> dict[str, int]:
    """Each step's depth, one more than the deepest step it waits for, found with a stack (chains run deep).

    A dependency on a key that is not among ``steps`` is left out.
    """
    by_key = {step.key: step for step in steps}
    depth: dict[str, int] = {}
    for step in steps:
        stack = [step.key]
        while stack:
            key = stack[-1]
            if key in depth:
                stack.pop()
                continue
            waiting = [k for k in by_key[key].deps if k in by_key and k not in depth]
            if waiting:
                # A run's steps form no cycle (the builder refuses one), so this ends.
                stack.extend(waiting)
                continue
            depth[key] = 1 + max((depth[k] for k in by_key[key].deps if k in by_key), default=-1)
            stack.pop()
    return depth


def layers(steps: Sequence[S]) -> list[list[S]]:
    """Steps grouped by depth, shallowest first, each group in the order given."""
    depth = depths(steps)
    grouped: dict[int, list[S]] = {}
    for step in steps:
        grouped.setdefault(depth[step.key], []).append(step)
    return [grouped[d] for d in sorted(grouped)]


@dataclass(frozen=True)
class _Lane:
    """A slot in ``column`` that the edges from ``source`` to steps further right pass through."""

    source: str
    column: int


#: Lane slots a page may add for edges that skip columns; past it, an edge is drawn
#: straight across, under the boxes between (only a page of hundreds of far-reaching
#: dependencies gets there, and a taller drawing would not be read either).
MAX_LANE_SLOTS = 1_000
_Slot = Union[str, _Lane]


def layout(columns: Sequence[Sequence[S]], *, max_lane_slots: int = MAX_LANE_SLOTS) -> Layout[S]:
    """Place ``columns`` (as :func:`layers` gives them, or a page of them) left to right, and join each step to its prerequisites.

    An edge between neighbouring columns is one curve. An edge that skips columns
    runs through a free slot (a lane) in each column between, shared by every such
    edge from the same step, so it never passes behind another step's box. An edge is
    drawn only between steps both placed here; a prerequisite on another page of a
    large run has none.
    """
    column_of = {step.key: index for index, column in enumerate(columns) for step in column}
    routes, lanes = _routes(columns, column_of, max_lane_slots)
    rows: dict[_Slot, int] = {}
    spots: dict[_Slot, tuple[int, int]] = {}
    nodes: list[Node[S]] = []
    for index, column in enumerate(columns):
        slots: list[tuple[_Slot, Optional[S]]] = [(step.key, step) for step in column]
        slots += [(lane, None) for lane in lanes[index]]
        before = [*(_step_before(step, routes, column_of) for step in column),
                  *(_lane_before(lane, column_of) for lane in lanes[index])]
        order = sorted(range(len(slots)), key=lambda i: _mean_row(before[i], rows))
        for row, position in enumerate(order):
            slot, step = slots[position]
            rows[slot] = row
            spots[slot] = (MARGIN + index * (NODE_WIDTH + COLUMN_GAP), MARGIN + row * (NODE_HEIGHT + ROW_GAP))
            if step is not None:
                nodes.append(Node(step, index, *spots[slot]))
    edges = [
        Edge(dep, node.step.key, _path([spots[dep], *(spots[lane] for lane in routes.get((dep, node.step.key), ())),
                                        spots[node.step.key]]))
        for node in nodes for dep in node.step.deps if dep in column_of
    ]
    tallest = max((len(column) + len(lanes[index]) for index, column in enumerate(columns)), default=0)
    width = 2 * MARGIN + len(columns) * NODE_WIDTH + max(0, len(columns) - 1) * COLUMN_GAP
    height = 2 * MARGIN + tallest * NODE_HEIGHT + max(0, tallest - 1) * ROW_GAP
    return Layout(tuple(nodes), tuple(edges), width, height)


def _routes(columns: Sequence[Sequence[Step]], column_of: dict[str, int],
            budget: int) -> tuple[dict[tuple[str, str], list[_Lane]], list[list[_Lane]]]:
    """The lanes each column-skipping edge runs through, and the lanes of each column, within the budget."""
    routes: dict[tuple[str, str], list[_Lane]] = {}
    lanes: list[list[_Lane]] = [[] for _ in columns]
    made: set[_Lane] = set()
    for index, column in enumerate(columns):
        for step in column:
            for dep in step.deps:
                start = column_of.get(dep)
                if start is None or index - start < 2:
                    continue
                route = [_Lane(dep, between) for between in range(start + 1, index)]
                new = [lane for lane in route if lane not in made]
                if len(new) > budget:
                    continue
                budget -= len(new)
                for lane in new:
                    made.add(lane)
                    lanes[lane.column].append(lane)
                routes[(dep, step.key)] = route
    return routes, lanes


def _step_before(step: Step, routes: dict[tuple[str, str], list[_Lane]], column_of: dict[str, int]) -> list[_Slot]:
    """The slots a step's lines come from: its prerequisites', or the last lane of the route from one."""
    return [routes[(dep, step.key)][-1] if (dep, step.key) in routes else dep for dep in step.deps if dep in column_of]


def _lane_before(lane: _Lane, column_of: dict[str, int]) -> list[_Slot]:
    """The slot a lane's lines come from: the step they leave, or the lane in the column before."""
    return [lane.source if lane.column == column_of[lane.source] + 1 else _Lane(lane.source, lane.column - 1)]


def _mean_row(before: list[_Slot], rows: dict[_Slot, int]) -> float:
    """Where the slots a slot's lines come from sit on average; one with none sorts after them all, in order."""
    placed = [rows[slot] for slot in before if slot in rows]
    return sum(placed) / len(placed) if placed else float(len(rows))


def _path(spots: list[tuple[int, int]]) -> str:
    """SVG path data from the first box's right side to the last one's left side, straight through each lane between.

    Between columns the line is a curve that leaves and arrives level.
    """
    middle = NODE_HEIGHT // 2
    x1, y1 = spots[0][0] + NODE_WIDTH, spots[0][1] + middle
    parts = [f"M{x1},{y1}"]
    for index, (x, y) in enumerate(spots[1:], start=1):
        x2, y2 = x, y + middle
        bend = (x2 - x1) // 2
        parts.append(f"C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}")
        if index < len(spots) - 1:
            parts.append(f"H{x2 + NODE_WIDTH}")
            x1, y1 = x2 + NODE_WIDTH, y2
    return " ".join(parts)
