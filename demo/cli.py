"""``poet-edge demo`` (the whole fleet on this machine) and ``poet-edge walkthrough`` (the planner and executor).

Registered in the ``poet_edge.commands`` entry-point group; cheap to import.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from common.errors import CommandError
from common.exit_codes import ExitCode


def add_commands(subparsers: Any) -> None:
    """Register ``demo`` and ``walkthrough``."""
    p = subparsers.add_parser("demo", help="the whole fleet on this machine: server, dashboard, three devices, "
                                           "Flower rounds, personalized models",
                              description="The whole fleet on this machine, from nothing configured to "
                                          "personalized models (demo.fleet_demo).")
    p.add_argument("--dir", type=Path, default=Path("poet-edge-demo"),
                   help="an empty or new folder for everything the demo makes (default: ./poet-edge-demo)")
    p.add_argument("--keep-running", action="store_true",
                   help="leave the server and dashboard up at the end, until Ctrl-C")
    p.add_argument("--short", action="store_true", help="fewer training steps (a quicker look)")
    p.set_defaults(handler=run_demo)
    from demo import walkthrough

    w = subparsers.add_parser("walkthrough", help="the planner and executor step by step: solve, sign, verify, "
                                                  "plot, then train a real model here under a schedule",
                              description=walkthrough.__doc__.split("\n\n")[0])
    walkthrough.add_arguments(w)
    w.set_defaults(handler=walkthrough.run)


def run_demo(args: argparse.Namespace) -> int:
    """Run the fleet demo; Ctrl-C or SIGTERM stops every process it started."""
    from demo.fleet_demo import DemoError, FleetDemo

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        FleetDemo(args.dir, short=args.short, keep_running=args.keep_running).run()
    except DemoError as exc:
        raise CommandError(f"demo: {exc}", ExitCode.REJECTED) from exc
    except KeyboardInterrupt:
        print("\ndemo: stopped; every process it started has been stopped", file=sys.stderr)
        return ExitCode.INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
    return ExitCode.OK
