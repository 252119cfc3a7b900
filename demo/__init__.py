"""The fleet on one machine: ``poet-edge demo``, and the rigs the tests and benchmarks run devices with.

Modules: :mod:`~demo.fleet_demo` (``poet-edge demo``: the fleet server, three device agents, local windows,
an unplugged device, Flower rounds and personalized models, told as a story), :mod:`~demo.devices` (a device:
a fake sysfs tree with a charger, battery and thermal zone, an agent config, a ``poet-edge agent run``
process), :mod:`~demo.flower_fleet` (a local CA for a SuperLink on this machine, and a Flower deployment of
agents for tests and the overhead benchmark), :mod:`~demo.walkthrough` (the planner and executor step by step: solve,
sign, verify, replay, then train a real model through the executor), :mod:`~demo.cli` (``poet-edge demo``,
``poet-edge walkthrough``).  It sits on top of the agent and the server; only the benchmarks import it.
"""
