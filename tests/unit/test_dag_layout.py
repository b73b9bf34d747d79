"""The workflow graph's layout (web/dag_layout.py): columns by depth, rows ordered by prerequisites, edges between boxes."""

from __future__ import annotations

from dataclasses import dataclass

from runledger_sync.web.dag_layout import (
    COLUMN_GAP,
    MARGIN,
    NODE_HEIGHT,
    NODE_WIDTH,
    ROW_GAP,
    depths,
    layers,
    layout,
)


@dataclass(frozen=True)
class Step:
    key: str
    deps: tuple[str, ...] = ()


def keys(columns):
    return [[step.key for step in column] for column in columns]


def place(steps):
    placed = layout(layers(steps))
    return {node.step.key: (node.column, node.x, node.y) for node in placed.nodes}, placed


COLUMN = NODE_WIDTH + COLUMN_GAP
ROW = NODE_HEIGHT + ROW_GAP


def test_a_step_sits_one_column_right_of_its_deepest_prerequisite():
    steps = [Step("charge"), Step("ship", ("charge",)), Step("approve", ("charge",)), Step("notify", ("ship", "approve")),
             Step("audit", ("charge", "notify"))]

    assert depths(steps) == {"charge": 0, "ship": 1, "approve": 1, "notify": 2, "audit": 3}
    assert keys(layers(steps)) == [["charge"], ["ship", "approve"], ["notify"], ["audit"]]


def test_positions_are_a_grid_of_boxes_and_the_size_holds_them_all():
    positions, placed = place([Step("a"), Step("b", ("a",)), Step("c", ("a",))])

    assert positions == {"a": (0, MARGIN, MARGIN), "b": (1, MARGIN + COLUMN, MARGIN), "c": (1, MARGIN + COLUMN, MARGIN + ROW)}
    assert placed.width == 2 * MARGIN + 2 * NODE_WIDTH + COLUMN_GAP
    assert placed.height == 2 * MARGIN + 2 * NODE_HEIGHT + ROW_GAP


def test_each_edge_runs_from_the_prerequisites_right_side_to_the_dependents_left_side():
    _, placed = place([Step("a"), Step("b", ("a",))])

    [edge] = placed.edges
    x1, y1 = MARGIN + NODE_WIDTH, MARGIN + NODE_HEIGHT // 2
    x2 = MARGIN + COLUMN
    bend = (x2 - x1) // 2
    assert (edge.source, edge.target) == ("a", "b")
    assert edge.path == f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y1} {x2},{y1}"


def test_rows_follow_the_prerequisites_so_edges_do_not_cross():
    # y waits for the second root, x for the first: drawn in the run's order they would cross.
    steps = [Step("first"), Step("second"), Step("y", ("second",)), Step("x", ("first",)), Step("loose")]

    positions, placed = place(steps)

    rows = {key: (y - MARGIN) // ROW for key, (_, _, y) in positions.items()}
    assert rows == {"first": 0, "second": 1, "loose": 2, "x": 0, "y": 1}
    assert sorted((e.source, e.target) for e in placed.edges) == [("first", "x"), ("second", "y")]


def test_an_edge_that_skips_a_column_runs_through_a_free_lane_there_not_behind_a_box():
    # a -> b -> c, and a -> c: the second edge crosses column 1, where b stands.
    positions, placed = place([Step("a"), Step("b", ("a",)), Step("c", ("b", "a"))])

    assert positions == {"a": (0, MARGIN, MARGIN), "b": (1, MARGIN + COLUMN, MARGIN), "c": (2, MARGIN + 2 * COLUMN, MARGIN)}
    assert placed.height == 2 * MARGIN + 2 * NODE_HEIGHT + ROW_GAP  # b's row, and the lane's below it
    long = next(edge for edge in placed.edges if (edge.source, edge.target) == ("a", "c"))
    mid, lane_mid = MARGIN + NODE_HEIGHT // 2, MARGIN + ROW + NODE_HEIGHT // 2
    x1, lane_x, x2 = MARGIN + NODE_WIDTH, MARGIN + COLUMN, MARGIN + 2 * COLUMN
    bend = (lane_x - x1) // 2
    assert long.path == (f"M{x1},{mid} C{x1 + bend},{mid} {lane_x - bend},{lane_mid} {lane_x},{lane_mid} "
                         f"H{lane_x + NODE_WIDTH} "
                         f"C{lane_x + NODE_WIDTH + bend},{lane_mid} {x2 - bend},{mid} {x2},{mid}")


def test_edges_from_one_step_share_its_lanes_and_past_the_budget_run_straight_across():
    steps = [Step("root"), Step("b1", ("root",)), Step("b2", ("b1",)), Step("far", ("root", "b2")),
             Step("farther", ("root", "far"))]

    shared = layout(layers(steps))
    rows_used = (shared.height - 2 * MARGIN + ROW_GAP) // ROW
    assert rows_used == 2  # each column between holds one step and root's one lane

    tight = layout(layers(steps), max_lane_slots=1)
    paths = {(edge.source, edge.target): edge.path for edge in tight.edges}
    assert "H" not in paths[("root", "far")] and "H" not in paths[("root", "farther")]
    assert (tight.height - 2 * MARGIN + ROW_GAP) // ROW == 1


def test_a_prerequisite_that_is_not_placed_draws_no_edge_and_an_empty_graph_is_empty():
    placed = layout([[Step("later", ("on-another-page",))]])
    assert [n.step.key for n in placed.nodes] == ["later"] and placed.edges == ()

    empty = layout([])
    assert (empty.nodes, empty.edges, empty.width, empty.height) == ((), (), 2 * MARGIN, 2 * MARGIN)


def test_a_deep_chain_is_laid_out_without_recursion():
    chain = [Step("s0")] + [Step(f"s{i}", (f"s{i - 1}",)) for i in range(1, 5_000)]

    placed = layout(layers(chain))

    assert placed.nodes[-1].column == 4_999 and len(placed.edges) == 4_999
