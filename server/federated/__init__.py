"""The server's side of federated learning: everything of the fleet server that speaks Flower, in one package.

Modules: :mod:`~server.federated.serverapp` (the ServerApp: sampling, FedAvg, personalization, a stored
global model version per round), :mod:`~server.federated.superlink` (the SuperLink the server runs beside its
API), :mod:`~server.federated.supernodes` (devices' SuperNode keys), :mod:`~server.federated.runs` (a run of
the app bundle ``flwr_app/`` on a SuperLink, through the ``flwr`` program) and
:mod:`~server.federated.rounds` (each device's reply per round, in the server's database).

Global model versions are the model registry's (:mod:`server.model_versions`); what both sides say to each
other is :mod:`common.messages`; the run configuration is :mod:`common.runconfig`.  Importing this package
imports no Flower.
"""
