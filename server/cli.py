"""``poet-edge server run | enrol-token | revoke | operator``: the fleet server and its operator commands.

::

    poet-edge server run [--data-dir D] [--database URL] [--host H] [--port P] [--solve-workers N]
                         [--solve-time-limit S] [--flower [--flower-tls-dir DIR] [--flower-host H]
                         [--flower-port P] [--no-flower-auth]]
    poet-edge server enrol-token [--expires 24h]     # prints a single-use enrolment token
    poet-edge server revoke NAME                     # the device's token is refused from now on
    poet-edge server operator add NAME [--password-stdin]     # a dashboard account (password asked twice)
    poet-edge server operator passwd NAME [--password-stdin]  # a new password; the operator's sessions end
    poet-edge server operator list
    poet-edge server supernode register NAME KEY.pub  # admit a device's Flower SuperNode (prints its node id)
    poet-edge server supernode list                   # the SuperLink's nodes, online or not, with device names
    poet-edge server federate [--rounds N] [--min-nodes N] [--personalization P] [--from-version V] ...
                                                      # federated rounds on the connected devices
    poet-edge server versions                         # the stored global model versions, newest first
    poet-edge server versions import FILE --model NAME  # a pretrained model as a signed version to start from
    poet-edge server versions export VERSION --out F  # a version's weights as .safetensors or .npz

Registered in the ``poet_edge.commands`` entry-point group (see
:mod:`common.cli`).  Importing this module is cheap: the web framework and
the database load inside the handlers.  The operator commands work on the
database directly (the server may be running: SQLite's write-ahead log lets
both in).
"""

from __future__ import annotations

import argparse
import datetime
import getpass
import logging
import re
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from common.runconfig import PERSONALIZATIONS, SIMULATION_ONLY, RunConfig
from common.exit_codes import ExitCode
from server.config import DEFAULT_DATA_DIR, FlowerSettings, ServerSettings
from server.errors import ServerConfigError, ServerStartError

DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*$")
SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_TOKEN_LIFETIME = 365 * 86400


def add_commands(subparsers: Any) -> None:
    """Register ``server`` with its ``run``, ``enrol-token``, ``revoke`` and ``operator`` subcommands."""
    p = subparsers.add_parser("server", help="the fleet server: device API, schedule registry, dashboard, metrics",
                              description="The fleet server: enrols devices, takes their heartbeats, plans and "
                                          "signs schedules for them (docs/api.md).")
    commands = p.add_subparsers(dest="server_command", metavar="COMMAND", required=True)
    run = commands.add_parser("run", help="run the server in the foreground (SIGTERM stops it)",
                              description="Serve the device API. Migrates the database and makes the server's "
                                          "signing key on first start; prints the key's id.")
    _storage_options(run)
    run.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    run.add_argument("--port", type=_port, default=8080, help="port (default: %(default)s; 0 picks a free one)")
    run.add_argument("--trusted-proxy", dest="trusted_proxies", action="append", default=[], metavar="ADDRESS",
                     help="a reverse proxy (IP or network) whose X-Forwarded-For names the client; repeat for "
                          "several. Without one the header is ignored (see deploy/README.md)")
    run.add_argument("--solve-workers", type=_positive_int, default=1, metavar="N",
                     help="planner processes solving at once (default: %(default)s)")
    run.add_argument("--solve-time-limit", type=_positive_float, default=60.0, metavar="S",
                     help="seconds each solve may search (default: %(default)s)")
    _flower_options(run)
    run.set_defaults(handler=run_server)
    token = commands.add_parser("enrol-token", help="print a new single-use enrolment token",
                                description="Make a single-use enrolment token; a device exchanges it once for "
                                            "its own device token (POST /api/v1/enrol).")
    _storage_options(token)
    token.add_argument("--expires", type=duration, default=duration("24h"), metavar="DURATION",
                       help="how long the token is valid: 90s, 30m, 24h, 7d (default: 24h)")
    token.set_defaults(handler=make_enrolment_token)
    tokens = commands.add_parser("tokens", help="enrolment tokens: list, revoke",
                                 description="Enrolment tokens made with enrol-token (their hashes: a token is "
                                             "shown only when made).")
    tokens_sub = tokens.add_subparsers(dest="tokens_command", metavar="COMMAND", required=True)
    token_list = tokens_sub.add_parser("list", help="list the newest enrolment tokens and their status",
                                       description="List enrolment tokens: id, made, expires, status, used by.")
    _storage_options(token_list)
    token_list.set_defaults(handler=list_tokens)
    token_revoke = tokens_sub.add_parser("revoke", help="revoke an unused enrolment token",
                                         description="Revoke an unused enrolment token by its id (tokens list): "
                                                     "no device can enrol with it from now on.")
    _storage_options(token_revoke)
    token_revoke.add_argument("id", type=_positive_int, help="the token's id, as tokens list shows it")
    token_revoke.set_defaults(handler=revoke_token)
    revoke = commands.add_parser("revoke", help="revoke a device: its token is refused from now on",
                                 description="Revoke an enrolled device; it can enrol again only with a new "
                                             "enrolment token.")
    _storage_options(revoke)
    revoke.add_argument("name", help="the device's name")
    revoke.set_defaults(handler=revoke_device)
    _add_operator_commands(commands)
    _add_supernode_commands(commands)
    _add_federate_command(commands)


def _flower_options(run: argparse.ArgumentParser) -> None:
    group = run.add_argument_group("Flower", "federated rounds: the server supervises a Flower SuperLink "
                                             "(deploy/README.md, TLS and SuperNode authentication)")
    group.add_argument("--flower", action="store_true", help="start and supervise flower-superlink")
    group.add_argument("--flower-tls-dir", type=Path, metavar="DIR",
                       help="folder with ca.crt, server.pem, server.key; without it the SuperLink runs without "
                            "TLS (a trusted lab network only, with --no-flower-auth)")
    group.add_argument("--flower-host", default="127.0.0.1", metavar="H",
                       help="address the SuperLink listens on (default: %(default)s)")
    group.add_argument("--flower-port", type=_port, default=9092, metavar="P",
                       help="the SuperLink's one port: Fleet, Control and Runtime APIs (default: %(default)s)")
    group.add_argument("--no-flower-auth", dest="flower_auth", action="store_false",
                       help="admit SuperNodes without a registered key (default: only registered keys)")


def _add_supernode_commands(commands: Any) -> None:
    p = commands.add_parser("supernode", help="devices' Flower SuperNode keys: register, list",
                            description="With SuperNode authentication the SuperLink admits only registered "
                                        "keys; each key gets a node id that stays the same across restarts.")
    sub = p.add_subparsers(dest="supernode_command", metavar="COMMAND", required=True)
    register = sub.add_parser("register", help="register a device's SuperNode public key",
                              description="Register the device's public key (STATE_DIR/flower/supernode.key.pub "
                                          "on the device) with the running SuperLink under the device's name.")
    _storage_options(register)
    register.add_argument("name", help="the device's name, as in its agent.toml [device] name")
    register.add_argument("public_key", type=Path, help="the device's ECDSA P-384 OpenSSH public key file")
    register.set_defaults(handler=register_supernode)
    listing = sub.add_parser("list", help="list the SuperLink's nodes with their device names",
                             description="Each node: id, device name, status (registered, online, offline).")
    _storage_options(listing)
    listing.set_defaults(handler=list_supernodes)


def _add_federate_command(commands: Any) -> None:
    p = commands.add_parser("federate", help="run federated rounds on the devices connected to the SuperLink",
                            description="Submit the fleet's Flower app (FedAvg over the devices' POET-scheduled "
                                        "training, then personalization) to the running server's SuperLink and "
                                        "follow it to its end; each device's reply is a row of the server's "
                                        "rounds table (dashboard: Rounds).")
    _storage_options(p)
    d = RunConfig()  # the app's defaults
    p.add_argument("--rounds", type=int, default=d.num_server_rounds, help="federated rounds (default: %(default)s)")
    p.add_argument("--min-nodes", type=int, default=d.min_nodes,
                   help="devices a round waits for (default: %(default)s)")
    p.add_argument("--fraction-train", type=float, default=d.fraction_train,
                   help="share of devices sampled to train, by the seed (default: %(default)s)")
    p.add_argument("--fraction-evaluate", type=float, default=d.fraction_evaluate,
                   help="share of devices sampled to evaluate (default: %(default)s)")
    p.add_argument("--local-steps", type=int, default=d.local_steps, help="training steps per device per round")
    p.add_argument("--lr", type=float, default=d.lr, help="the devices' SGD learning rate")
    p.add_argument("--personalization", default=d.personalization,
                   choices=[p for p in PERSONALIZATIONS if p not in SIMULATION_ONLY],  # what device agents run
                   help="what stays personal on the devices (default: %(default)s)")
    p.add_argument("--finetune-steps", type=int, default=d.finetune_steps,
                   help="local fine-tuning steps after the rounds")
    p.add_argument("--round-timeout", type=float, default=d.round_timeout, help="seconds a round waits for replies")
    p.add_argument("--local-baseline", action="store_true",
                   help="each device also trains alone from the initial weights, with the steps it spent in the "
                        "run, and reports that model's accuracy beside the global and personalized ones")
    p.add_argument("--seed", type=int, default=d.seed, help="seeds the model's weights and each round's sample")
    p.add_argument("--from-version", default="latest", type=_initial_version, metavar="VERSION",
                   help="the global model to start from: latest (the newest stored version of the devices' model, "
                        "default), none (the seeded initial weights) or a version number")
    p.add_argument("--retries", type=int, default=2, metavar="N",
                   help="a run that fails (a SuperLink or ServerApp restart mid-round) is submitted again up to N "
                        "times, from its last stored global model, for the rounds it has not finished "
                        "(default: %(default)s)")
    p.add_argument("--detach", action="store_true", help="print the run id and return without waiting")
    p.set_defaults(handler=federate)
    versions = commands.add_parser("versions", help="list, import and export the stored global model versions",
                                   description="Each version of the global model, newest first: its number, the "
                                               "Flower run and round that made it (or the file it was imported "
                                               "from), the version it was aggregated from, the round's mean "
                                               "accuracy, and its weights file's hash.")
    _storage_options(versions)
    versions.add_argument("--limit", type=_positive_int, default=20, help="how many (default: %(default)s)")
    versions.set_defaults(handler=list_model_versions)
    actions = versions.add_subparsers(dest="versions_action", metavar="{import,export}")
    imported = actions.add_parser(
        "import", help="store a pretrained model as a signed version a federation starts from",
        description="Store pretrained weights (a .safetensors or .npz file, or a save_pretrained folder) as a "
                    "signed global model version of the devices' model: `server federate` (--from-version latest, "
                    "or its number) starts from it. Weights tied to another (a language model's output layer) may "
                    "be absent, as save_pretrained leaves them; the run fills them in from what the devices say.")
    imported.add_argument("weights", type=Path, help="the weights file or save_pretrained folder")
    imported.add_argument("--model", required=True, metavar="NAME",
                          help="the workload name the devices report (as `server versions` shows it, before the "
                               "hash): a zoo name such as gpt2, or pretrained:FOLDER for a device that builds its "
                               "model from a save_pretrained folder")
    _storage_options(imported, suppress=True)
    imported.set_defaults(handler=import_model_version)
    exported = actions.add_parser(
        "export", help="write a stored version's weights to a file",
        description="Write global model version VERSION (latest: the newest), checked against its signature and "
                    "hash, to OUT as a state dict: .safetensors (what [workload] weights, transformers and most "
                    "tools read) or .npz. `poet-edge agent export --weights OUT` makes TorchScript or ONNX of it.")
    exported.add_argument("version", type=_version_choice, help="a version number, or latest")
    exported.add_argument("--out", type=Path, required=True, help="the file to write (.safetensors or .npz)")
    _storage_options(exported, suppress=True)
    exported.set_defaults(handler=export_model_version)


def _version_choice(text: str) -> int | None:
    if text == "latest":
        return None
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise argparse.ArgumentTypeError(f"{text!r}: use a version number or latest")


def _initial_version(text: str) -> str:
    if text in ("latest", "none") or text.isdigit():
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: use latest, none or a version number")


def _add_operator_commands(commands: Any) -> None:
    p = commands.add_parser("operator", help="dashboard accounts: add, passwd, remove, list",
                            description="Operators sign in to the dashboard (the server's web pages) with a "
                                        "password, stored as an argon2 hash.")
    sub = p.add_subparsers(dest="operator_command", metavar="COMMAND", required=True)
    for name, handler, text in (("add", add_operator, "add an operator"),
                                ("passwd", change_password, "set an operator's password (its sessions end)")):
        command = sub.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]}. The password is asked "
                                 "twice on a terminal; otherwise one line is read from standard input.")
        _storage_options(command)
        command.add_argument("name", help="the operator's name (1-64 characters of A-Z a-z 0-9 . _ @ -)")
        command.add_argument("--password-stdin", action="store_true",
                             help="read the password as one line from standard input, even on a terminal")
        if name == "add":
            command.add_argument("--role", choices=("admin", "viewer"), default="admin",
                                 help="admin changes things (tokens, revocations); a viewer only reads "
                                      "(default: %(default)s)")
        command.set_defaults(handler=handler)
    remove = sub.add_parser("remove", help="remove an operator (its sessions end at once)",
                            description="Remove a dashboard operator; its browser sessions end at once.")
    _storage_options(remove)
    remove.add_argument("name", help="the operator's name")
    remove.set_defaults(handler=remove_operator)
    listing = sub.add_parser("list", help="list the operators", description="List the dashboard's operators.")
    _storage_options(listing)
    listing.set_defaults(handler=list_operators)


def _storage_options(p: argparse.ArgumentParser, suppress: bool = False) -> None:
    """``--data-dir`` and ``--database``; ``suppress``: a subcommand's, which leave its parent's value alone
    unless given."""
    p.add_argument("--data-dir", type=Path, default=argparse.SUPPRESS if suppress else DEFAULT_DATA_DIR,
                   metavar="DIR", help=f"the server's folder: database and signing key (default: ./{DEFAULT_DATA_DIR})")
    p.add_argument("--database", metavar="URL", default=argparse.SUPPRESS if suppress else None,
                   help="SQLAlchemy database URL (default: sqlite:///DIR/server.db)")


def settings_from(args: argparse.Namespace) -> ServerSettings:
    """The settings the options give (defaults for the ones a subcommand has not)."""
    options = {"data_dir": args.data_dir, "database": args.database}
    for name in ("host", "port", "solve_workers", "solve_time_limit"):
        if hasattr(args, name):
            options[name] = getattr(args, name)
    if getattr(args, "trusted_proxies", None):
        options["trusted_proxies"] = tuple(args.trusted_proxies)
    if getattr(args, "flower", False):
        options["flower"] = FlowerSettings(host=args.flower_host, port=args.flower_port, tls_dir=args.flower_tls_dir,
                                           supernode_auth=args.flower_auth)
    return ServerSettings(**options)


# -- handlers -------------------------------------------------------------------------
def run_server(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or Ctrl-C."""
    import uvicorn

    from server.api import create_app

    settings = settings_from(args)
    listener = listen(settings.host, settings.port)
    _configure_logging()
    app = create_app(settings)
    host, port = listener.getsockname()[:2]
    key = app.state.server.key
    print(f"poet-edge server: listening on http://{_url_host(host)}:{port}; server key {key.key_id} "
          f"({key.path.with_suffix('.pub')}); data in {settings.data_dir}", flush=True)
    # X-Forwarded-For only from the proxies named: a client must not choose the address it is limited under
    trusted = ",".join(settings.trusted_proxies)
    config = uvicorn.Config(app, log_config=None, access_log=False, proxy_headers=bool(trusted),
                            forwarded_allow_ips=trusted or None, server_header=False,
                            timeout_graceful_shutdown=10)  # requests are counted in /metrics, not logged
    # uvicorn stops gracefully on SIGTERM/SIGINT, then raises the signal again for the handler that was there
    # before it started: a no-op one here, so a requested stop exits 0 (what systemd and the shell expect).
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, lambda *_: None)
    superlink = start_superlink(settings)
    try:
        uvicorn.Server(config).run(sockets=[listener])
    finally:
        if superlink is not None:
            superlink.stop()
    return ExitCode.OK


def start_superlink(settings: ServerSettings) -> Any:
    """The supervised Flower SuperLink when the settings ask for one (ready to take SuperNodes), else ``None``."""
    if settings.flower is None:
        return None
    from server.federated.superlink import CONNECTION, SuperLink

    superlink = SuperLink(settings)
    superlink.start()
    try:
        superlink.wait_ready()
    except BaseException:
        superlink.stop()
        raise
    print(f"poet-edge server: Flower SuperLink on {settings.flower.address} "
          f"({'TLS' if settings.flower.tls_dir else 'no TLS'}, SuperNode authentication "
          f"{'on' if settings.flower.node_auth else 'off'}); `flwr run APP {CONNECTION}` with "
          f"FLWR_HOME={superlink.home.resolve()}", flush=True)
    return superlink


def make_enrolment_token(args: argparse.Namespace) -> int:
    """Print a new enrolment token on standard output, its expiry on standard error."""
    from server import audit
    from server.datadir import open_database
    from server.devices import create_enrolment_token

    now = time.time()
    db = open_database(settings_from(args))
    token, token_id = create_enrolment_token(db, args.expires, now)
    expires = datetime.datetime.fromtimestamp(now + args.expires).strftime("%Y-%m-%d %H:%M:%S")
    audit.record(db, "token.create", actor=audit.cli_actor(), target=f"token {token_id}",
                 detail=f"valid until {expires}")
    print(token)
    print(f"single-use enrolment token {token_id}, valid until {expires}", file=sys.stderr)
    return ExitCode.OK


def list_tokens(args: argparse.Namespace) -> int:
    """Print the newest enrolment tokens: id, made, expires, status, used by."""
    from server.datadir import open_database
    from server.devices import list_enrolment_tokens, token_status

    now = time.time()
    for t in list_enrolment_tokens(open_database(settings_from(args))):
        print(f"{t.id}	{_when(t.created_at)}	{_when(t.expires_at)}	{token_status(t, now)}	{t.used_by or '-'}")
    return ExitCode.OK


def revoke_token(args: argparse.Namespace) -> int:
    """Revoke an unused enrolment token by id."""
    from server import audit
    from server.datadir import open_database
    from server.devices import revoke_enrolment_token

    db = open_database(settings_from(args))
    if revoke_enrolment_token(db, args.id, time.time()):
        audit.record(db, "token.revoke", actor=audit.cli_actor(), target=f"token {args.id}")
        print(f"revoked enrolment token {args.id}: no device can enrol with it")
    else:
        print(f"enrolment token {args.id} was revoked already")
    return ExitCode.OK


def _when(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def revoke_device(args: argparse.Namespace) -> int:
    """Revoke the named device."""
    from server import audit
    from server.datadir import open_database
    from server.devices import revoke

    db = open_database(settings_from(args))
    if revoke(db, args.name, time.time()):
        audit.record(db, "device.revoke", actor=audit.cli_actor(), target=args.name)
        print(f"revoked {args.name}: its device token is refused from now on")
    else:
        print(f"{args.name} was revoked already")
    return ExitCode.OK


def add_operator(args: argparse.Namespace) -> int:
    """Create a dashboard operator with a password read as :func:`read_password` reads it."""
    from server import audit
    from server.dashboard.operators import add_operator as add, check_operator_name
    from server.datadir import open_database

    check_operator_name(args.name)
    password = read_password(args.password_stdin)
    db = open_database(settings_from(args))
    add(db, args.name, password, time.time(), role=args.role)
    audit.record(db, "operator.add", actor=audit.cli_actor(), target=args.name, detail=f"role {args.role}")
    print(f"added operator {args.name} ({args.role}): sign in to the dashboard at http://HOST:PORT/login")
    return ExitCode.OK


def change_password(args: argparse.Namespace) -> int:
    """Set an operator's password; its sessions end."""
    from server import audit
    from server.dashboard.operators import check_operator_name, set_password
    from server.datadir import open_database

    check_operator_name(args.name)
    db = open_database(settings_from(args))
    set_password(db, args.name, read_password(args.password_stdin))
    audit.record(db, "operator.passwd", actor=audit.cli_actor(), target=args.name)
    print(f"changed the password of {args.name}; its dashboard sessions have ended")
    return ExitCode.OK


def remove_operator(args: argparse.Namespace) -> int:
    """Remove an operator; its sessions end."""
    from server import audit
    from server.dashboard.operators import remove_operator as remove
    from server.datadir import open_database

    db = open_database(settings_from(args))
    remove(db, args.name)
    audit.record(db, "operator.remove", actor=audit.cli_actor(), target=args.name)
    print(f"removed operator {args.name}; its dashboard sessions have ended")
    return ExitCode.OK


def list_operators(args: argparse.Namespace) -> int:
    """Print each operator and when it was added."""
    from server.dashboard.operators import list_operators as operators
    from server.datadir import open_database

    for operator in operators(open_database(settings_from(args))):
        added = datetime.datetime.fromtimestamp(operator.created_at).strftime("%Y-%m-%d %H:%M:%S")
        print(f"{operator.username}\t{operator.role}\tadded {added}")
    return ExitCode.OK


def register_supernode(args: argparse.Namespace) -> int:
    """Register a device's SuperNode key with the running SuperLink; print the node id."""
    from server.federated.supernodes import register

    node_id = register(settings_from(args), args.name, args.public_key)
    print(f"registered {args.name}: node id {node_id}; its SuperNode may connect from now on")
    return ExitCode.OK


def list_supernodes(args: argparse.Namespace) -> int:
    """Print the SuperLink's nodes: node id, device name, status."""
    from server.federated.supernodes import list_nodes

    for node in list_nodes(settings_from(args)):
        print(f"{node['node-id']}\t{node['device'] or '-'}\t{node['status']}")
    return ExitCode.OK


def federate(args: argparse.Namespace) -> int:
    """Submit the fleet's Flower app to the server's SuperLink; wait for it and print its rounds.

    A run that fails after storing some rounds' global models (the SuperLink or the ServerApp restarted
    mid-round) is submitted again for the rounds it did not finish, from its last stored version; the rows
    it stored stay.
    """
    from server.datadir import open_database
    from server.errors import FlowerError
    from server.federated.runs import start_run, wait_finished, wait_reachable
    from server.model_versions import list_versions

    settings = settings_from(args)
    home = settings.flower_dir / "home"
    if not (home / "config.toml").is_file():
        raise ServerStartError(f"no SuperLink connection in {home}: start the server with --flower "
                               f"(poet-edge server run --flower --data-dir {settings.data_dir})")
    run_config = federate_run_config(args, settings)
    run_ids: list[int] = []
    first_round, start = 1, args.from_version
    for attempt in range(args.retries + 1):
        rounds = args.rounds - first_round + 1
        run_id = start_run(home, {**run_config, "num-server-rounds": rounds, "first-round": first_round,
                                  "initial-version": start})
        run_ids.append(run_id)
        print(f"federated run {run_id} started: rounds {first_round}-{args.rounds} on at least {args.min_nodes} "
              f"devices, from global model {start}", flush=True)
        if args.detach:
            return ExitCode.OK
        try:
            wait_finished(home, run_id, timeout=(rounds + 2) * 2 * args.round_timeout)
            break
        except FlowerError as exc:
            if attempt == args.retries:
                raise
            stored = list_versions(open_database(settings), limit=1, run_id=str(run_id))
            if stored:
                first_round, start = stored[0].round + 1, str(stored[0].version)
            print(f"run {run_id} failed ({str(exc).splitlines()[0]}); submitting again from round {first_round} "
                  f"and global model {start}", flush=True)
            wait_reachable(home)
    print_rounds(settings, run_ids)
    return ExitCode.OK


def list_model_versions(args: argparse.Namespace) -> int:
    """Print the newest stored global model versions."""
    from server.datadir import open_database
    from server.model_versions import list_versions

    versions = list_versions(open_database(settings_from(args)), limit=args.limit)
    if not versions:
        print("no global model stored yet: `poet-edge server federate` stores one per round")
    for v in versions:
        made = datetime.datetime.fromtimestamp(v.created_at).strftime("%Y-%m-%d %H:%M:%S")
        accuracy = v.metrics.get("evaluate.accuracy")
        shown = f"{accuracy:.3f}" if isinstance(accuracy, (int, float)) else "-"
        parent = v.parent if v.parent is not None else "-"
        print(f"v{v.version}\trun {v.run_id} round {v.round}\tfrom {parent}\taccuracy {shown}\t{v.model}\t"
              f"{v.sha256[:16]}\t{made}")
    return ExitCode.OK


def import_model_version(args: argparse.Namespace) -> int:
    """Store a pretrained model's weights as a signed version of the devices' model."""
    from server.datadir import open_database
    from server.keys import load_or_create
    from server.model_files import read_weights
    from server.model_versions import import_version

    settings = settings_from(args)
    arrays = read_weights(args.weights)
    info = import_version(open_database(settings), settings.data_dir, load_or_create(settings.keys_dir).private_key,
                          arrays, name=args.model, source=str(args.weights))
    size = sum(a.nbytes for a in arrays.values())
    print(f"v{info.version}\timported from {args.weights} ({len(arrays)} arrays, {size / 1e6:,.1f} MB)\t{info.model}\t"
          f"{info.sha256[:16]}")
    print(f"`poet-edge server federate --from-version {info.version}` (or latest) starts the devices that train "
          f"{args.model} from it")
    return ExitCode.OK


def export_model_version(args: argparse.Namespace) -> int:
    """Write a stored version's weights, checked against its signature and hash, to a file."""
    from server.datadir import open_database
    from server.keys import load_or_create
    from server.model_files import write_weights
    from server.model_versions import load_version

    settings = settings_from(args)
    key = load_or_create(settings.keys_dir).private_key.public_key()
    info, arrays = load_version(open_database(settings), settings.data_dir, key, args.version)
    write_weights(arrays, args.out)
    print(f"wrote {args.out}: global model v{info.version} ({info.model}, run {info.run_id} round {info.round}), "
          f"{len(arrays)} arrays")
    return ExitCode.OK


def federate_run_config(args: argparse.Namespace, settings: ServerSettings) -> dict[str, Any]:
    """The run config ``poet-edge server federate`` submits (:class:`common.runconfig.RunConfig`), checked here
    so that a bad value fails before the run is submitted."""
    from common.errors import RunConfigError

    try:
        config = RunConfig(num_server_rounds=args.rounds, min_nodes=args.min_nodes, fraction_train=args.fraction_train,
                           fraction_evaluate=args.fraction_evaluate, local_steps=args.local_steps, lr=args.lr,
                           personalization=args.personalization, finetune_steps=args.finetune_steps,
                           round_timeout=args.round_timeout, seed=args.seed, local_baseline=args.local_baseline,
                           # empty: the ServerApp records into the database its SuperLink names
                           # ($POET_EDGE_DATABASE_URL), so no credentials travel in the run config, which the
                           # SuperLink stores
                           database_url="")
        config.check()
    except RunConfigError as exc:
        raise ServerConfigError(str(exc)) from exc
    return config.to_mapping()


def print_rounds(settings: ServerSettings, run_ids: list[int]) -> None:
    """Per round the devices that answered and their mean accuracy; per device the personalization (over the
    Flower runs of one federation, in order)."""
    from server.datadir import open_database
    from server.federated.rounds import PERSONALIZED, PHASES, round_rows

    from common.keep_best import kept_name

    database = open_database(settings)
    rows = sorted((row for run_id in run_ids for row in round_rows(database, run_id)),
                  key=lambda r: (r.round, PHASES.index(r.phase) if r.phase in PHASES else len(PHASES), r.device_name))
    for row in rows:
        m = row.metrics
        if "error" in m:
            print(f"round {row.round} {row.phase:<11} {row.device_name:<24} error: {m['error']}")
            continue
        accuracy = f"{m['accuracy']:.3f}" if m.get("accuracy", -1) >= 0 else "-"
        extra = (f" global {m['global-accuracy']:.3f} -> personal {m['personal-accuracy']:.3f}"
                 if row.phase in PERSONALIZED else f" loss {m.get('eval-loss', -1):.4f}")
        if "local-accuracy" in m:
            extra += f" (alone {m['local-accuracy']:.3f})"
        if kept_name(m.get("kept")):
            extra += f", kept {kept_name(m['kept'])} {m['kept-accuracy']:.3f}"
            if m.get("kept-by-fleet") == 1:
                extra += f" (the fleet's choice; its own: {kept_name(m.get('own-kept'))})"
        peak, budget = (f"{int(m[k]):,} B" if m.get(k, -1) >= 0 else "-" for k in ("peak-bytes", "budget-bytes"))
        print(f"round {row.round} {row.phase:<11} {row.device_name:<24} accuracy {accuracy}{extra} "
              f"peak {peak} / budget {budget}")


def read_password(from_stdin: bool) -> str:
    """The new password: typed twice without echo on a terminal, else one line of standard input.

    Raises
    ------
    PasswordRejectedError
        The two typings differ, or standard input is empty; too short or too long.
    """
    from server.dashboard.errors import PasswordRejectedError
    from server.dashboard.operators import check_password

    if from_stdin or not sys.stdin.isatty():
        line = sys.stdin.readline()
        if not line:
            raise PasswordRejectedError("no password on standard input: pipe one line, or run on a terminal")
        return check_password(line.rstrip("\r\n"))
    first = check_password(getpass.getpass("password: "))
    if getpass.getpass("password again: ") != first:
        raise PasswordRejectedError("the two passwords differ; run the command again")
    return first


# -- helpers ----------------------------------------------------------------------------
def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one), or :class:`ServerStartError` saying why not."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        raise ServerStartError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another --host or "
                               "--port") from exc
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)


def duration(text: str) -> float:
    """argparse type: ``90s``, ``30m``, ``24h``, ``7d`` or plain seconds, > 0 and at most a year."""
    match = DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (90s, 30m, 24h, 7d)")
    seconds = float(match.group(1)) * SECONDS[match.group(2)]
    if not 0 < seconds <= MAX_TOKEN_LIFETIME:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 and at most 365d")
    return seconds


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535)")
    return int(text)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 1")
    return int(text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
    return value

