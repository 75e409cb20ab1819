"""``san-hil lab up|down|status|ssh|run``: argparse glue over :mod:`hil.lab.lab`.

The lab modules are imported only when a lab command runs, so ``san-hil prepare`` pays nothing for them.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hil.lab import LabError
from hil.lab.kernel import DEFAULT_CACHE, DEFAULT_KERNEL, KERNELS
from hil.lab.layout import DEFAULT_LOW_MEMORY
from hil.lab.provider import DEFAULT_PROVIDER, PROVIDERS
from hil.lab.state import DEFAULT_STATE_DIR

if TYPE_CHECKING:
    from hil.lab.lab import UpOptions

__all__ = ["add_lab_commands"]

_Command = Callable[[argparse.Namespace], int]


def _state_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                        help=f"where the lab keeps keys, logs and its state (default {DEFAULT_STATE_DIR})")


def _up_arguments(parser: argparse.ArgumentParser, hosts_default: int) -> None:
    parser.add_argument("--hosts", type=int, default=hosts_default, help=f"guests to boot (default {hosts_default})")
    parser.add_argument("--memory", default="1G", help="memory per guest (default 1G)")
    parser.add_argument("--hugepages", type=int, default=None, metavar="N",
                        help="2 MiB hugetlb pages reserved in each guest, for the userspace stand-in's contiguous "
                             "memory and DMA buffers (default: 32 with --no-proxy-module, else 0: the module "
                             "needs none)")
    _state_dir(parser)
    parser.add_argument("--inventory-out", type=Path, default=None,
                        help="where to write the inventory (default <state dir>/lab.yaml)")
    parser.add_argument("--kernel", choices=tuple(KERNELS), default=DEFAULT_KERNEL,
                        help=f"the guests' kernel: {', '.join(f'{k.name} ({k.debian})' for k in KERNELS.values())}; "
                             f"default {DEFAULT_KERNEL}")
    parser.add_argument("--kernel-cache", type=Path, default=DEFAULT_CACHE,
                        help=f"guest kernel cache (default {DEFAULT_CACHE})")
    parser.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto",
                        help="auto (default): KVM only if a short probe guest really runs under it")
    parser.add_argument("--boot-timeout", type=float, default=300.0,
                        help="seconds per boot attempt until the guest says it is ready (default 300)")
    parser.add_argument("--provider", choices=tuple(PROVIDERS), default=DEFAULT_PROVIDER,
                        help="the RDMA device of every guest: rxe (default) Soft-RoCE rxe0, or siw Soft-iWARP "
                             "siw0 (siw.ko built once for the lab kernel)")
    parser.add_argument("--proxy-module", action=argparse.BooleanOptionalAction, default=True,
                        help="build san_proxy.ko (hil/kmod) for the lab kernel and load it in every guest, so the "
                             "agent drives /dev/san_proxy (default); --no-proxy-module: the agent's userspace "
                             "stand-in")
    parser.add_argument("--low-memory", default=DEFAULT_LOW_MEMORY, metavar="SIZE|all",
                        help=f"RAM of each guest below 4 GiB, the rest of --memory above it (default "
                             f"{DEFAULT_LOW_MEMORY}: a DMA32 and a Normal zone, for NOLOWMEM); all: everything "
                             "below 4 GiB, qemu's own layout")


def _options(args: argparse.Namespace) -> UpOptions:
    from hil.lab.lab import UpOptions

    return UpOptions(hosts=args.hosts, memory=args.memory, hugepages=args.hugepages, state_dir=args.state_dir,
                     inventory_out=args.inventory_out, kernel_cache=args.kernel_cache, accel=args.accel,
                     boot_timeout=args.boot_timeout, provider=args.provider, kernel=args.kernel,
                     proxy_module=args.proxy_module, low_memory=args.low_memory)


def _guarded(run: _Command, interrupted: str = "interrupted") -> _Command:
    """Run a lab command with SIGTERM handled like Ctrl-C (``interrupted`` says what that left; a second
    signal is ignored: hil.lab.lab.stop_once), and LabError as a message and status 2."""

    def wrapper(args: argparse.Namespace) -> int:
        from hil.lab.lab import handle_stop_signals

        previous = handle_stop_signals()
        try:
            return run(args)
        except LabError as exc:
            print(f"san-hil lab: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"san-hil lab: {interrupted}", file=sys.stderr)
            return 130
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    return wrapper


def _up(args: argparse.Namespace) -> int:
    from hil.lab.lab import up

    up(_options(args))
    return 0


def _down(args: argparse.Namespace) -> int:
    from hil.lab.lab import down

    return down(args.state_dir)


def _status(args: argparse.Namespace) -> int:
    from hil.lab.lab import status

    return status(args.state_dir)


def _passed_on(args: argparse.Namespace) -> list[str]:
    """The arguments after ``--`` (``san-hil``'s main took the ``--`` itself)."""
    return list(getattr(args, "extra_args", []))


def _ssh(args: argparse.Namespace) -> int:
    import subprocess

    from hil.lab.lab import ssh_command

    # `lab ssh lab1 echo -- hi`: the command began before the `--`, which is then part of it.
    before = list(args.remote_command)
    command = [*before, "--", *_passed_on(args)] if before and _passed_on(args) else [*before, *_passed_on(args)]
    return subprocess.call(ssh_command(args.state_dir, args.guest, command))


def _reproduce(args: argparse.Namespace) -> int:
    import subprocess

    from hil.lab.lab import ssh_command
    from hil.lab.reproduce import remote_command

    return subprocess.call(ssh_command(args.state_dir, args.guest, remote_command(args.name)))


def _run(args: argparse.Namespace) -> int:
    from hil.lab.lab import run

    return run(_options(args), _passed_on(args))


def add_lab_commands(commands: Any) -> None:
    """Add ``lab`` and its subcommands to ``san-hil``'s subparsers (``commands``)."""
    lab = commands.add_parser("lab", allow_abbrev=False,
                              help="a Soft-RoCE (or Soft-iWARP) lab of qemu guests here (virtme-ng)",
                              description="Boot, inspect, use and remove a Soft-RoCE or Soft-iWARP lab on this "
                                          "machine.")
    sub = lab.add_subparsers(dest="lab_command", metavar="LAB_COMMAND", required=True)

    p = sub.add_parser("up", allow_abbrev=False, help="boot the guests and write an inventory for them")
    _up_arguments(p, hosts_default=2)
    p.set_defaults(run=_guarded(_up, "interrupted; the lab was stopped"))

    p = sub.add_parser("down", allow_abbrev=False, help="stop every guest and remove everything `up` made")
    _state_dir(p)
    p.set_defaults(run=_guarded(_down))

    p = sub.add_parser("status", allow_abbrev=False, help="what runs: guests, pids, ports, alive or not")
    _state_dir(p)
    p.set_defaults(run=_guarded(_status))

    p = sub.add_parser("ssh", allow_abbrev=False, usage="san-hil lab ssh [--state-dir DIR] GUEST [--] [command ...]",
                       help="a shell (or a command, its exit status passed on) on a guest, with the lab's keys")
    _state_dir(p)
    p.add_argument("guest", help="the guest's name, as `san-hil lab status` shows it (lab1, lab2, ...)")
    p.add_argument("remote_command", nargs=argparse.REMAINDER, metavar="command",
                   help="what to run on the guest (default: a shell); after GUEST, options included")
    # its usage line says it all
    p.set_defaults(run=_guarded(_ssh, "interrupted; the lab is still up"), accepts_extra_args=True, passes_on=None)

    p = sub.add_parser("reproduce", allow_abbrev=False,
                       help="a kernel bug the verbs engine works around, shown in a guest with the workaround off "
                            "(exit 1: still there, 0: gone, 2: cannot tell); it may hang that guest's device")
    _state_dir(p)
    from hil.lab.reproduce import REPRODUCERS  # standard library only until one runs

    p.add_argument("name", choices=sorted(REPRODUCERS), help="the workaround (hil/agent/engines/verbs/quirks.py)")
    p.add_argument("--guest", default="lab1", help="the guest to reproduce it in (default lab1)")
    p.set_defaults(run=_guarded(_reproduce, "interrupted; the lab is still up"))

    p = sub.add_parser("run", allow_abbrev=False, usage="san-hil lab run [options] [-- pytest args ...]",
                       help="up, the conformance suite on the lab (arguments after -- go to pytest), down")
    _up_arguments(p, hosts_default=2)
    p.set_defaults(run=_guarded(_run, "interrupted; the lab was stopped"), accepts_extra_args=True)
