"""`make run` (rag_assets.run) says what it is doing while a job runs, and every headline has text."""

import io
import re
import time

import dagster as dg

from rag_assets.run import _headline, stage_progress

OUT = io.StringIO()
SEEN_DURING_THE_RUN: list[str] = []


@dg.op
def first() -> int:
    time.sleep(1.5)  # longer than a poll of the event log
    return 1


@dg.op
def second(value: int) -> int:
    deadline = time.monotonic() + 10
    while "first: done" not in OUT.getvalue() and time.monotonic() < deadline:
        time.sleep(0.1)
    SEEN_DURING_THE_RUN.append(OUT.getvalue())
    return value + 1


@dg.job
def two_steps():
    second(first())


def test_stage_progress_prints_each_step_as_it_starts_and_ends():
    with dg.instance_for_test() as instance, stage_progress(instance, "tag-1", OUT):
        result = two_steps.execute_in_process(instance=instance, tags={"rag/progress": "tag-1"})
    assert result.success
    assert "first: done in" in SEEN_DURING_THE_RUN[0]  # printed while the job was still running
    lines = OUT.getvalue().splitlines()
    assert [re.sub(r"^\s*\[\s*[\d.]+ s\] ", "", line).split(" in ")[0] for line in lines] == [
        "first: started",
        "first: done",
        "second: started",
        "second: done",
    ]
    took = float(re.search(r"first: done in ([\d.]+) s", OUT.getvalue()).group(1))
    assert 1.4 <= took < 30


def test_headline_of_an_asset_without_headline_figures_is_not_empty():
    assert _headline({"verdict": "main: recall@5 steady"}) == "verdict=main: recall@5 steady"
    assert _headline({"nights": object()}).strip()
