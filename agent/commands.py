"""``poet-edge agent run`` and ``poet-edge agent status``: the device agent daemon and what it is doing.

::

    poet-edge agent run    --config /etc/poet-agent/agent.toml     # systemd runs this (deploy/poet-agent.service)
    poet-edge agent status --config /etc/poet-agent/agent.toml [--json]
    poet-edge agent export --config /etc/poet-agent/agent.toml --out model.pt [--format onnx]

Registered in the ``poet_edge.commands`` entry-point group (see
:mod:`common.cli`).  ``run`` and ``status`` do not import torch: ``run`` trains in a
worker process (:mod:`agent.daemon.worker`); ``export`` builds the model.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agent.personal_model import EXPORT_FORMATS
from common.cli import positive_int
from common.errors import CommandError
from common.exit_codes import ExitCode


def add_commands(subparsers: Any) -> None:
    """Register ``agent`` with its ``run`` and ``status`` subcommands."""
    p = subparsers.add_parser("agent", help="the device agent: train while idle and charging, and its status",
                              description="The device agent daemon (see deploy/ for its systemd unit).")
    commands = p.add_subparsers(dest="agent_command", metavar="COMMAND", required=True)
    run = commands.add_parser("run", help="run the daemon in the foreground (systemd starts it so)",
                              description="Wait until the device is idle, charging and cool; then train the "
                                          "configured model on local data under a POET schedule, checkpointing. "
                                          "Stops at a step boundary when eligibility is lost; SIGTERM "
                                          "checkpoints and exits.")
    run.add_argument("--config", required=True, metavar="FILE", help="agent config (deploy/agent.example.toml)")
    run.set_defaults(handler=run_agent)
    status = commands.add_parser("status", help="what the agent is doing and why",
                                 description="State and reason, steps, loss and held-out accuracy, the schedule "
                                             "and memory against budget, energy and the last error.")
    status.add_argument("--config", required=True, metavar="FILE", help="the agent's config")
    status.add_argument("--json", action="store_true", help="print the status as JSON (keys state, reason, "
                                                            "steps_done are stable)")
    status.add_argument("--history", nargs="?", type=positive_int, const=20, default=None, metavar="N",
                        help="the last N training windows instead (default 20): when, how long, steps, loss, "
                             "energy and why each ended")
    status.set_defaults(handler=show_status)
    export = commands.add_parser("export", help="write the personalized model for inference (TorchScript or ONNX)",
                                 description="The model this device personalized in its last federated run "
                                             "(STATE_DIR/personal), checked against its provenance and written "
                                             "in inference mode as TorchScript (torch.jit.trace) or ONNX "
                                             "(torch.onnx.export).")
    export.add_argument("--config", required=True, metavar="FILE", help="the agent's config")
    export.add_argument("--format", choices=EXPORT_FORMATS, default="torchscript",
                        help="default: %(default)s")
    export.add_argument("--out", required=True, type=Path, metavar="FILE", help="where to write it")
    export.add_argument("--weights", type=Path, metavar="FILE",
                        help="export these weights in the config's model instead of the personalized one: a "
                             ".safetensors or .pt state dict (such as a global version `poet-edge server versions "
                             "export` wrote), every name and shape checked")
    export.set_defaults(handler=export_model)


def run_agent(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM."""
    from agent import application
    from agent.config import load_config
    from agent.daemon.supervisor import configure_logging

    config = load_config(args.config)
    _check_writable_dirs(config)
    configure_logging()
    return application.run(config)


def _check_writable_dirs(config: Any) -> None:
    import os

    for label, directory in (("device.state_dir", config.device.state_dir), ("device.swap_dir", config.swap_dir)):
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CommandError(f"{label} {directory}: cannot create it: {exc.strerror or exc}",
                               ExitCode.STORAGE) from exc
        if not os.access(directory, os.W_OK | os.X_OK):
            raise CommandError(f"{label} {directory} is not writable by this user", ExitCode.STORAGE)


def show_status(args: argparse.Namespace) -> int:
    """Print the daemon's last status."""
    from agent.config import load_config
    from agent.daemon.status import read_status
    from agent.personal_model import folder as personal_folder
    from agent.personal_model import read_provenance

    config = load_config(args.config)
    if getattr(args, "history", None):
        from agent.daemon import history

        windows = history.read(config.history_path, last=args.history)
        if args.json:
            json.dump(history.as_dicts(windows), sys.stdout, indent=1)
            print()
        else:
            print(history.format_history(windows))
        return ExitCode.OK
    status = read_status(config.status_path)
    if status is None:
        status = {"state": "stopped", "reason": f"the agent has not run yet (no {config.status_path})",
                  "steps_done": 0}
    personal = read_provenance(config.device.state_dir)
    if personal is not None:
        status["personalized"] = {**asdict(personal), "path": str(personal_folder(config.device.state_dir))}
    if args.json:
        json.dump(status, sys.stdout, indent=1)
        print()
    else:
        print(format_status(status))
    return ExitCode.OK


def export_model(args: argparse.Namespace) -> int:
    """Write the kept personalized model (or the weights ``--weights`` names) as TorchScript or ONNX."""
    from agent.config import load_config
    from agent.prepare import build_workload
    from agent.personal_model import export, read_provenance
    from agent.weight_files import describe as describe_weights, fingerprint as weights_fingerprint

    config = load_config(args.config)
    workload = build_workload(config)
    if args.weights is not None:
        from agent.personal_model import write_inference
        from agent.weights import load_weights

        load_weights(workload.model, args.weights)
        write_inference(workload.model, workload.inputs, args.out, args.format)
        print(f"wrote {args.out} ({args.format}): {workload.name} with the weights of {args.weights}")
        return ExitCode.OK
    provenance = read_provenance(config.device.state_dir)
    if provenance is not None and (provenance.model, provenance.input) != (workload.name, config.workload.input):
        raise CommandError(f"the kept personalized model is a {provenance.model} for {provenance.input}, but the "
                           f"config names a {workload.name} for {config.workload.input}: personalize again",
                           ExitCode.BAD_FILE)
    configured = weights_fingerprint(config.workload.weights) if config.workload.weights is not None else None
    if provenance is not None and provenance.weights_sha256 != configured:
        kept_from = describe_weights(provenance.weights_sha256)
        raise CommandError(f"the kept personalized model's device started from {kept_from}, but the config names "
                           f"{describe_weights(configured)}: export with the config it was personalized under, "
                           "or personalize again",
                           ExitCode.BAD_FILE)
    export(config.device.state_dir, workload.model, workload.inputs, args.out, args.format)
    print(f"wrote {args.out} ({args.format}): personalized from global model "
          f"{_version(provenance.global_version) if provenance else '?'}")
    return ExitCode.OK


def _version(version: int | None) -> str:
    return f"v{version}" if version is not None else "(not stored)"


def format_status(s: dict[str, Any]) -> str:
    """The status for a person: one figure per line, unknown ones left out."""
    from agent.daemon.status import unsaved_steps

    rows = [("state", f"{s['state']}: {s.get('reason') or ''}")]
    if s.get("since"):
        rows.append(("since", datetime.datetime.fromtimestamp(s["since"]).strftime("%Y-%m-%d %H:%M:%S")))
    unsaved = unsaved_steps(s)
    pending = f" ({unsaved:,} not yet in a checkpoint)" if unsaved else ""
    rows.append(("steps", f"{s.get('steps_done') or 0:,}{pending}"))
    if s.get("loss") is not None:
        rows.append(("last loss", f"{s['loss']:.4f}"))
    if s.get("holdout_accuracy") is not None or s.get("holdout_loss") is not None:
        acc = f"accuracy {100 * s['holdout_accuracy']:.1f}%, " if s.get("holdout_accuracy") is not None else ""
        rows.append(("held out", f"{acc}loss {s['holdout_loss']:.4f}"))
    if s.get("schedule_id"):
        rows.append(("schedule", f"{s['schedule_id']} from {s.get('schedule_from')}, budget "
                                 f"{_mb(s.get('memory_budget_bytes'))}"))
    if s.get("peak_bytes"):
        rows.append(("step memory", f"{_mb(s['peak_bytes'])} of a bound of {_mb(s.get('bound_bytes'))} "
                                    "(peak RSS beyond the loaded model)"))
    if s.get("memory_parts"):
        planned = s.get("planned_parts") or {}
        rows.append(("  parts", ", ".join(f"{name} {_mb(value)} (planned {_mb(planned.get(name))})"
                                          for name, value in s["memory_parts"].items())))
    if s.get("energy_j"):
        rows.append(("energy", f"{s['energy_j']:,.1f} J ({s.get('energy_source') or 'unknown meter'})"))
    if s.get("data"):
        rows.append(("data", s["data"]))
    for verdict in s.get("eligibility") or []:
        rows.append((f"  {verdict['name']}", f"{'ok' if verdict['eligible'] else 'no'}: {verdict['reason']}"))
    if s.get("network"):
        rows.append(("network", s["network"]))
    if s.get("supernode"):
        rows.append(("supernode", s["supernode"]))
    if s.get("personalized"):
        p = s["personalized"]
        made = datetime.datetime.fromtimestamp(p["saved_at"]).strftime("%Y-%m-%d %H:%M:%S")
        rows.append(("personalized", f"from global model {_version(p['global_version'])} (run {p['run_id']}, "
                                     f"{p['personalization']}, {p['steps']} steps, {made}): held-out accuracy "
                                     f"{100 * p['accuracy_before']:.1f}% -> {100 * p['accuracy_after']:.1f}%, "
                                     f"in {p['path']}"))
        rows.append(("  kept", _kept(p)))
    for damaged in s.get("checkpoints_passed_over") or []:
        rows.append(("passed over", f"{damaged} (renamed aside to .damaged; resumed from the one before)"))
    rows.append(("last error", s.get("last_error") or "none"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _kept(p: dict[str, Any]) -> str:
    """The kept candidate and its margins over the others, on the held-out half the choice never saw."""
    kept = p.get("kept") or "personal"
    accuracy = {"global": p["accuracy_before"], "personal": p["accuracy_after"], "local": p.get("accuracy_local")}
    mine = p.get("accuracy_kept") if p.get("accuracy_kept") is not None else accuracy[kept]
    margins = ", ".join(f"{100 * (mine - value):+.1f} points over {name}" for name, value in accuracy.items()
                        if name != kept and value is not None)
    return f"{kept} model ({100 * mine:.1f}%{'; ' + margins if margins else ''})"


def _mb(value: Any) -> str:
    return f"{value / 1e6:,.1f} MB" if isinstance(value, (int, float)) else "?"
