"""What every package of POET Edge shares, beneath them all; imports nothing of theirs.

- :mod:`common.runconfig` the fleet's Flower run configuration, typed: the keys the ServerApp, the ClientApp,
  ``poet-edge server federate`` and ``poet-edge simulate`` read and write.
- :mod:`common.messages` what the ServerApp and the ClientApp say to each other: message types and record keys.
- :mod:`common.errors` ``RunConfigError``, a ``ValueError`` each package converts into its own error tree.
"""
