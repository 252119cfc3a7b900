"""``poet-edge agent status``'s text: what a person reads of the status file."""

from agent.commands import format_status
from agent.daemon.status import initial_status


def test_steps_not_yet_in_a_checkpoint_are_shown_as_such() -> None:
    status = {**initial_status("pi-1"), "state": "training", "reason": "schedule s1", "steps_done": 7,
              "steps_saved": 3}
    assert "7 (4 not yet in a checkpoint)" in format_status(status)
    status["steps_saved"] = 7  # the checkpoint caught up
    assert "not yet in a checkpoint" not in format_status(status)
    assert "not yet" not in format_status(initial_status("pi-1"))  # nothing restored yet: nothing to say
