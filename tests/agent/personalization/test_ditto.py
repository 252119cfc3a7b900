from __future__ import annotations


from agent.digits import SmallCNN, device_dataset
from agent.personalization import strategy
from agent.personalization.ditto import Ditto


def test_ditto_holds_a_second_whole_model_beside_each_step() -> None:
    chosen = strategy("ditto")
    assert chosen.trains_beside and chosen.simulation_only
    weights = SmallCNN().state_dict()
    assert Ditto.held_bytes(weights) == sum(t.nbytes for t in weights.values())


def test_the_personal_model_is_pulled_towards_the_global_one() -> None:
    from agent.federated import clientapp as client

    task = client.task_for(0)
    data = device_dataset(0, 2)
    plan = task.plan("rpi4", None)
    anchor = {k: v.clone() for k, v in task.initial.items()}
    own = {k: v + 0.5 if v.is_floating_point() else v.clone() for k, v in task.initial.items()}

    def distance(strength: float) -> float:
        out = Ditto.train_personal(task, own, anchor, data, plan, steps=2, lr=0.05, position=(0, 0),
                                   strength=strength).weights
        return sum(float((out[k] - anchor[k]).float().norm()) for k in anchor if anchor[k].is_floating_point())

    assert distance(1.0) < distance(0.0)

