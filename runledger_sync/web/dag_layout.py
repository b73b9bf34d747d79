"""Where each step of a workflow run's graph is drawn: columns by dependency depth, edges as curves (no I/O).

The page draws the result as inline SVG: no script lays anything out in the browser.
A step sits one column right of the deepest step it waits for; within a column,
steps are ordered by where their prerequisites sit (the mean of their rows), which
keeps most edges from crossing, and otherwise keep the run's order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, Sequence, TypeVar

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


def layout(columns: Sequence[Sequence[S]]) -> Layout[S]:
    """Place ``columns`` (as :func:`layers` gives them, or a page of them) left to right, and join each step to its prerequisites.

    An edge is drawn only between steps both placed here; a prerequisite on
    another page of a large run has none.
    """
    rows: dict[str, float] = {}
    nodes: list[Node[S]] = []
    for index, column in enumerate(columns):
        ordered = sorted(column, key=lambda step: _mean_row(step, rows, len(rows)))
        for row, step in enumerate(ordered):
            rows[step.key] = row
            nodes.append(Node(step, index, MARGIN + index * (NODE_WIDTH + COLUMN_GAP),
                              MARGIN + row * (NODE_HEIGHT + ROW_GAP)))
    placed = {node.step.key: node for node in nodes}
    edges = [
        Edge(dep, node.step.key, _curve(placed[dep], node))
        for node in nodes for dep in node.step.deps if dep in placed
    ]
    tallest = max((len(column) for column in columns), default=0)
    width = 2 * MARGIN + len(columns) * NODE_WIDTH + max(0, len(columns) - 1) * COLUMN_GAP
    height = 2 * MARGIN + tallest * NODE_HEIGHT + max(0, tallest - 1) * ROW_GAP
    return Layout(tuple(nodes), tuple(edges), width, height)


def _mean_row(step: Step, rows: dict[str, float], unplaced: int) -> float:
    """Where the step's placed prerequisites sit on average; steps without any sort after them, in order."""
    placed = [rows[key] for key in step.deps if key in rows]
    return sum(placed) / len(placed) if placed else float(unplaced)


def _curve(source: Node[S], target: Node[S]) -> str:
    """From the middle of the source's right side to the middle of the target's left side, leaving and arriving level."""
    x1, y1 = source.x + NODE_WIDTH, source.y + NODE_HEIGHT // 2
    x2, y2 = target.x, target.y + NODE_HEIGHT // 2
    bend = (x2 - x1) // 2
    return f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}"
