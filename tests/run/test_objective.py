"""rlchain.run.objective: the run objective's name, its check, and the best value in either direction."""

from __future__ import annotations

import math

import pytest

from rlchain.run.objective import Best, Objective, ObjectiveError


@pytest.mark.parametrize(
    "direction, values, best",
    [("maximize", [0.2, 0.5, 0.5, 0.4], (0.5, 1)), ("minimize", [0.2, 0.5, 0.1, 0.1], (0.1, 2))],
)
def test_the_best_is_strictly_better_and_a_tie_keeps_the_earlier(direction, values, best):
    tracker = Best(direction)
    for step, value in enumerate(values):
        tracker.offer(value, step)
    assert (tracker.value, tracker.step) == best


def test_a_missing_or_non_finite_value_never_becomes_the_best():
    tracker = Best("maximize")
    assert not tracker.offer(None, 0) and not tracker.offer(math.nan, 1) and not tracker.offer(math.inf, 2)
    assert tracker.value is None and tracker.offer(-5.0, 3) and tracker.value == -5.0


def test_every_best_gets_a_new_id_and_the_state_round_trips():
    tracker = Best("maximize")
    tracker.offer(1.0, 10)
    first = tracker.id
    tracker.offer(2.0, 20)
    assert tracker.id != first and len(tracker.id) == 32
    restored = Best("maximize")
    restored.load_state_dict(tracker.state_dict())
    assert restored.state_dict() == {"value": 2.0, "step": 20, "id": tracker.id}
    restored.load_state_dict({})
    assert restored.state_dict() == {"value": None, "step": None, "id": None}


def test_auto_resolves_by_what_the_evaluation_logs():
    with_success = Objective("auto", "maximize")
    with_success.resolve({"eval/success_rate": 0.5, "eval/avg_reward": 1.0})
    without = Objective("auto", "maximize")
    without.resolve({"eval/avg_reward": 1.0})
    assert with_success.name == "eval/success_rate" and without.name == "eval/avg_reward"
    assert without.value({"eval/avg_reward": 3.0}) == 3.0 and without.value({}) is None


def test_an_objective_the_run_never_logs_names_a_close_match_and_every_name():
    objective = Objective("eval/succes_rate", "maximize")
    with pytest.raises(ObjectiveError) as caught:
        objective.check({"eval/success_rate", "charts/SPS"})
    assert str(caught.value) == (
        "trainer.objective='eval/succes_rate' is not a metric this run logs (did you mean 'eval/success_rate'?): "
        "expected one of charts/SPS, eval/success_rate"
    )
    Objective("auto", "maximize").check(set())  # auto passes before it is resolved
