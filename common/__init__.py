"""What every package of POET Edge shares, beneath them all; imports nothing of theirs, nor torch or Flower.

- :mod:`common.cli` the ``poet-edge`` command's shell: ``main``, the entry-point registry of subcommands, the
  argument types every package uses.
- :mod:`common.errors` the root of the one error tree (``PoetEdgeError``), ``CommandError``,
  ``FormatError`` (a malformed file or document) and ``RunConfigError``.
- :mod:`common.exit_codes` ``ExitCode``, ``EXIT_CODES`` and ``exit_code_for``: where an error becomes a status.
- :mod:`common.canonical` canonical JSON (one byte string per value, for hashes and signatures) and
  validated JSON loading that fails with ``FormatError``.
- :mod:`common.files` ``write_atomically``: a file replaced whole or not at all (state on disk).
- :mod:`common.units` byte sizes as people type them (``3MB``, ``1.5MiB``).
- :mod:`common.backoff` ``Backoff``: when a supervisor starts a failed child again (the agent's training process,
  the SuperNode and its warm runner, the SuperLink, the planner processes).
- :mod:`common.programs` and :mod:`common.process_tree` finding installed programs, free ports and Flower's
  environment; signalling and stopping a child's whole process tree (the SuperLink and SuperNode supervisors).
- :mod:`common.runconfig` the fleet's Flower run configuration, typed: the keys the ServerApp, the ClientApp,
  ``poet-edge server federate`` and ``poet-edge simulate`` read and write.
- :mod:`common.messages` what the ServerApp and the ClientApp say to each other: message types and record keys.
"""
