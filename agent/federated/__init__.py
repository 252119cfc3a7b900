"""The device's side of federated learning: everything of the agent that speaks Flower, in one package.

Modules: :mod:`~agent.federated.clientapp` (the ClientApp: the messages a device answers),
:mod:`~agent.federated.task` (what a round asks of a device, with no Flower in it: train under the device's
schedule, evaluate, personalize), :mod:`~agent.federated.virtual` (a simulated fleet's virtual devices: node
configs, data spread, availability traces), :mod:`~agent.federated.supernode` (the device's SuperNode, running
while the device is eligible), :mod:`~agent.federated.runner` (the warm ClientApp runner) and
:mod:`~agent.federated.launcher` (the ``flwr-clientapp`` program that hands each launch to it).

What both sides say to each other is :mod:`common.messages`; the run configuration is
:mod:`common.runconfig`.  Importing this package imports neither torch nor Flower.
"""
