"""pytest-san's command-line options and ini keys, all in the ``san`` group of ``pytest --help``.

The options that choose and configure lab hosts live here too, not in the backend that reads them:
a backend plugin is imported only once ``--san-backend`` names it (``backends.py``), which is after
the command line was parsed.
"""

from __future__ import annotations

import argparse
import math

import pytest

from ..spi.protocols import ModelBudget

DEFAULT_BACKEND = "emulator"


def seconds(text: str) -> float:
    """An option's seconds: a finite number >= 0 (argparse names the option in its error)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def hosts_count(text: str) -> str:
    """``--san-hosts-per-worker``: auto, all or a number >= 1 (how it compares with the hosts is checked
    once they are known, at session start)."""
    value = text.strip().lower()
    if value in ("auto", "all"):
        return value
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, 'auto' or 'all', got {text!r}")
    return value


def at_least_one(text: str) -> int:
    """A count >= 1 (argparse names the option in its error)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}")
    return int(text)


def register_always(text: str) -> str:
    """``--san-nvme-register-always``: Y or N (also yes/no, 1/0, any case)."""
    value = {"y": "Y", "yes": "Y", "1": "Y", "n": "N", "no": "N", "0": "N"}.get(text.strip().lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"register_always is Y or N, not {text!r}")
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("san", "SAN conformance (pytest-san)")
    group.addoption("--san-backend", metavar="NAME", default=None,
                    help=f"backend to run SAN tests on: emulator (in-process), hil (lab hosts) or one a plugin adds "
                         f"(default: $SAN_BACKEND, else ini san_backend, else {DEFAULT_BACKEND!r})")
    group.addoption("--san-report", metavar="PATH", default=None,
                    help="write the conformance report (rule -> passed/failed/skipped) as JSON to PATH")
    group.addoption("--san-rules", metavar="IDS", default=None,
                    help="run only the tests marked with one of these rules (comma-separated, e.g. R6,R8); "
                         "the others are deselected")
    group.addoption("--san-sample", metavar="N", type=at_least_one, default=None,
                    help="run N scenarios of each rule, those this backend can run first (more where a scenario drawn "
                         "for another rule is marked with it too): a budget's run, the whole suite is what judges "
                         "an implementation")
    group.addoption("--san-sample-seed", metavar="N", type=int, default=1,
                    help="the seed that draws --san-sample's scenarios (default 1)")
    parser.addini("san_backend", f"default for --san-backend (else {DEFAULT_BACKEND!r})",
                  default=DEFAULT_BACKEND)

    # The reference model: in the suite (pytest_san/plugin/model.py) and deep (pytest --pyargs pytest_san.model).
    group.addoption("--san-model-sequences", metavar="N", type=int, default=None,
                    help="the reference model: random SPI sequences to run (default: in the suite the backend's "
                         f"budget, docs/model.md; pytest_san.model {ModelBudget().sequences}); 0 leaves the model "
                         "out of the suite")
    group.addoption("--san-model-steps", metavar="N", type=int, default=None,
                    help="the reference model: steps per sequence (default: in the suite the backend's budget; "
                         f"pytest_san.model {ModelBudget().steps})")
    group.addoption("--san-model-deadline", metavar="SECONDS", type=float, default=None,
                    help="the reference model: start no new sequence after SECONDS (default: in the suite the "
                         "backend's budget; pytest_san.model none); a divergence found is still shrunk, within the "
                         "same time")
    group.addoption("--san-model-seed", metavar="N", type=int, default=None,
                    help="the reference model: the seed to draw sequences from (default: 1 in the suite, a fresh "
                         "one for pytest_san.model; every run prints its own: replay it)")
    group.addoption("--san-model-differential", action="store_true", default=False,
                    help="the reference model: also run every sequence on a fresh emulator and compare the two "
                         "step by step")
    group.addoption("--san-model-checks", choices=("auto", "all", "touched"), default="auto",
                    help="the reference model: check everything after every step (all), or only what the step could "
                         "change and everything at the end of a sequence (touched); auto: as the backend's budget "
                         "says (all on the emulator)")

    # Lab hosts (--san-backend=hil).
    group.addoption("--san-inventory", metavar="PATH", default=None,
                    help="lab inventory for --san-backend=hil: an Ansible inventory file, YAML or INI, with "
                         "group_vars/ and host_vars/ beside it (default: $SAN_INVENTORY, else ini san_inventory, "
                         "relative to the rootdir)")
    group.addoption("--san-group", metavar="GROUP", default=None,
                    help="inventory group whose hosts are used (default: san)")
    group.addoption("--san-hosts", metavar="HOSTS", default=None,
                    help="comma-separated: names of the inventory group's hosts (a subset), and/or host URLs "
                         "that need no inventory: ssh://[user@]host[:port][?device=rxe0&port=1&gid_index=1], "
                         "local://[?engine=emulator&loopback=1]")
    group.addoption("--san-lease-timeout", metavar="SECONDS", type=seconds, default=None,
                    help="how long to wait for lab hosts leased by others, then fail naming the holders "
                         "(default: ini san_lease_timeout, else the backend's: 300 on hil)")
    group.addoption("--san-hosts-per-worker", metavar="N|auto|all", type=hosts_count, default=None,
                    help="hosts each pytest process or xdist worker leases out of the selected ones; auto "
                         "(default): 1 if every host is emulator-engine or san_loopback, else 2 (a pair)")
    group.addoption("--san-labgrid", metavar="FILTER", default=None,
                    help="take the lab hosts from a labgrid place with these tags (KEY=VALUE[,...], e.g. "
                         "san=verbs-pair), reserved and acquired per pytest process or xdist worker; implies "
                         "--san-backend=hil (extra pytest-san[labgrid]; docs/labgrid.md)")
    group.addoption("--san-labgrid-coordinator", metavar="HOST[:PORT]", default=None,
                    help="the labgrid coordinator for --san-labgrid (default: $LG_COORDINATOR, else the "
                         "inventory's san_labgrid_coordinator)")
    group.addoption("--san-labgrid-priority", metavar="N", type=float, default=None,
                    help="the labgrid reservation's priority: higher is served first (default 0; nightly "
                         "runs queue low, e.g. -10)")
    group.addoption("--san-device", metavar="NAME", default=None,
                    help="RDMA device on every selected host (overrides san_device)")
    group.addoption("--san-port", metavar="N", type=int, default=None,
                    help="RDMA port number on every selected host (overrides san_port; default: the first ACTIVE)")
    group.addoption("--san-gid-index", metavar="N", type=int, default=None,
                    help="GID table index on every selected host (overrides san_gid_index)")
    group.addoption("--san-nvme-register-always", metavar="Y|N", type=register_always, default="Y",
                    help="nvme_rdma's register_always for the NVMe-oF observed scenarios (default Y, the kernel's; "
                         "N turns on the unsafe global rkey, which the rogue target then finds)")
    parser.addini("san_inventory", "lab inventory (Ansible YAML or INI) for --san-backend=hil", default=None)
    parser.addini("san_group", "inventory group used by --san-backend=hil", default="san")
    parser.addini("san_lease_timeout", "default for --san-lease-timeout (seconds)", default="")
    parser.addini("san_hosts_per_worker", "default for --san-hosts-per-worker", default="auto")
