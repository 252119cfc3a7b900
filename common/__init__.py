"""What every package of POET Edge shares, beneath them all; imports nothing of theirs.

- :mod:`common.runconfig` the fleet's Flower run configuration, typed: the keys the ServerApp, the ClientApp,
  ``poet-edge server federate`` and ``poet-edge simulate`` read and write.
"""
