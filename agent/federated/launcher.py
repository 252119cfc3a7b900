"""``flwr-clientapp`` as the device's SuperNode finds it: hands the launch to the agent's warm runner.

Flower's SuperExec starts the program ``flwr-clientapp`` by name for every
message.  The agent installs this file under that name first on the
SuperNode's ``PATH`` (:func:`agent.federated.supernode.install_launcher`, run as
``python -IS``: the standard library only, a few milliseconds to start).  It
sends its arguments and its launch time to the runner's Unix socket
(``$POET_CLIENTAPP_SOCKET``) and exits once the runner has taken the launch
on (the runner forks the ClientApp once the message has arrived).  When the
runner does not answer (still loading, or stopped) it becomes Flower's own
program (``$POET_FLWR_CLIENTAPP``): slower to start, the same result.  A
runner that finds the launcher gone when it answers leaves the launch to it,
so one launch never gives two ClientApps.
"""

import json
import os
import socket
import sys
import time

SOCKET_VARIABLE = "POET_CLIENTAPP_SOCKET"
PROGRAM_VARIABLE = "POET_FLWR_CLIENTAPP"
ANSWER_SECONDS = 20.0  # for the runner to take the launch on (it answers in turn, after the launches before)


def hand_over(path: str, argv: list, launched_at: float) -> bool:
    """Ask the runner at ``path`` to start the ClientApp; whether it did."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(ANSWER_SECONDS)
            connection.connect(path)
            connection.sendall(json.dumps({"argv": argv, "launched_at": launched_at}).encode() + b"\n")
            with connection.makefile("r", encoding="utf-8") as answer:
                return answer.readline().strip() == "accepted"
    except (OSError, ValueError):
        return False


def main() -> None:
    launched_at = time.time()
    path = os.environ.get(SOCKET_VARIABLE)
    if path and hand_over(path, sys.argv[1:], launched_at):
        sys.exit(0)
    program = os.environ.get(PROGRAM_VARIABLE)
    if not program:
        sys.exit(f"flwr-clientapp launcher: ${PROGRAM_VARIABLE} does not name Flower's flwr-clientapp")
    os.execv(program, [program, *sys.argv[1:]])


if __name__ == "__main__":
    main()
