"""The Spark pipeline under a seeded fault schedule (tests/chaos/spark_pipeline.py): its verdict
on hand-made inputs and outputs, and one short schedule that kills the driver, Spark's Python
workers, an output leader and the transaction coordinator, and must find nothing wrong.

The long run is ``python -m tests.chaos.spark_pipeline --seed 10 --schedules 3``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.chaos.spark_driver import transformed
from tests.chaos.spark_pipeline import FAULT_KINDS, Outcome, compare, plan, run_schedule


def verdict(inputs: list[str], outputs: list[str], acked: set[str]) -> dict[str, list[str]]:
    outcome = Outcome()
    compare([v.encode() for v in inputs], [v.encode() for v in outputs], acked, outcome)
    return {kind: found for kind, found in outcome.anomalies.items() if found}


@pytest.mark.unit
def test_the_verdict_on_an_exact_output_is_clean() -> None:
    inputs = ["in-1-0000000", "in-1-0000001"]
    assert verdict(inputs, [transformed(v) for v in inputs], set(inputs)) == {}


@pytest.mark.unit
def test_the_verdict_names_lost_duplicated_and_unexpected_records() -> None:
    inputs = ["in-1-0000000", "in-1-0000001", "in-1-0000002"]
    a, b, _ = (transformed(v) for v in inputs)
    found = verdict(inputs, [a, a, b, "out:IN-9-0000000", "in-1-0000000"], set(inputs))
    assert found == {
        "lost": [transformed("in-1-0000002")],
        "duplicated": [a],
        "unexpected": ["in-1-0000000", "out:IN-9-0000000"],
    }


@pytest.mark.unit
def test_the_verdict_names_acked_input_missing_or_twice_in_the_input_topic() -> None:
    inputs = ["in-1-0000000", "in-1-0000000"]
    found = verdict(inputs, [transformed(inputs[0])] * 2, {"in-1-0000000", "in-1-0000001"})
    assert found == {"input_lost": ["in-1-0000001"], "input_duplicated": ["in-1-0000000"]}


@pytest.mark.unit
def test_a_plan_holds_every_fault_kind_once_before_any_repeats() -> None:
    assert sorted(plan(3, 4)) == sorted(FAULT_KINDS)
    assert plan(3, 7) == plan(3, 7)
    assert len(plan(3, 7)) == 7
    assert plan(3, 7)[:4] == plan(3, 4)


@pytest.mark.spark
@pytest.mark.cluster
@pytest.mark.chaos
def test_a_seeded_schedule_of_every_fault_kind_writes_each_record_once(tmp_path: Path) -> None:
    result = run_schedule(20, 4, tmp_path, records=500)
    assert sorted(f["kind"] for f in result["faults"]) == sorted(FAULT_KINDS)
    assert result["driver_starts"] == 2  # the first start and the restart after driver_kill
    assert result["ok"], json.dumps(result, indent=1)
    assert result["records_out"] == result["records_in"] >= 500
