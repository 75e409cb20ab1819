"""--san-labgrid's parts without a coordinator: the settings, identities, a place as hosts, the booking's order
(cancel, then release), the reaper's reading of leases; and what a run says without labgrid or a coordinator.
Only the last needs labgrid installed; the rest run in every tox environment."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from hil.agent import lease
from hil.inventory import HostConfig
from hil.scheduling.booking import Booking, LabgridTimeout, holders_text
from hil.scheduling.config import Identity, LabgridConfig, LabgridConfigError, identity_of, parse_filter
from hil.scheduling.coordinator import CoordinatorError, CoordinatorSession, PlaceView, ReservationView, ResourceView
from hil.scheduling.places import PlaceError, place_hosts
from hil.scheduling.reaper import lease_patterns, live_leases
from tests.support.sshd import free_port


def test_a_filter_is_tags() -> None:
    assert parse_filter("san=verbs-pair") == {"san": "verbs-pair"}
    assert parse_filter("san=pair, rack=r2") == {"san": "pair", "rack": "r2"}
    for bad in ("", "san", "San=x", "s=x", "san=a b=", "san=x,san=y"):
        with pytest.raises(LabgridConfigError, match="--san-labgrid"):
            parse_filter(bad)


def test_the_coordinator_comes_from_the_option_then_lg_coordinator_then_the_inventory() -> None:
    def config(option: str | None, env: str | None, inventory: str | None) -> LabgridConfig:
        environ = {"LG_COORDINATOR": env} if env else {}
        return LabgridConfig.from_settings("san=pair", option=option, environ=environ, inventory=inventory,
                                           priority=None)

    assert (config("a:1", "b:2", "c:3").coordinator, config("a:1", "b:2", "c:3").source) == (
        "a:1", "--san-labgrid-coordinator")
    assert (config(None, "b:2", "c:3").coordinator, config(None, "b:2", "c:3").source) == ("b:2", "LG_COORDINATOR")
    assert config(None, None, "c:3").source == "the inventory's san_labgrid_coordinator"
    with pytest.raises(LabgridConfigError, match="no labgrid coordinator: give --san-labgrid-coordinator"):
        config(None, None, None)
    assert LabgridConfig.from_settings("san=x", option="h", environ={}, inventory=None, priority=-10).priority == -10


def test_an_identity_names_controller_user_run_and_worker() -> None:
    ident = Identity("ctl.lab", "alice.b", "3f2a9c", "gw1")
    assert ident.name == "ctl.lab/pytest-san.alice.b.3f2a9c.gw1"
    assert identity_of(ident.name) == ident
    assert identity_of("ctl/alice") is None and identity_of("nobody") is None
    assert identity_of(Identity("c", "u/x y", "r", "main").name) == Identity("c", "u_x_y", "r", "main")


def _place(name: str = "pair1", resources: tuple[tuple[str, str | None], ...] = (("leaseA", "node1"),
                                                                                   ("leaseB", "node2")),
           acquired: str | None = "ctl/pytest-san.u.r.gw0") -> PlaceView:
    return PlaceView(name=name, tags={"san": "pair"}, acquired=acquired, changed=0.0, reservation=None,
                     matches=(), acquired_resources=tuple((("lab", g, "NetworkService", "NetworkService"), rename)
                                                          for g, rename in resources))


def _resources(port: int = 2222, **params: Any) -> dict[tuple[str, str, str, str], ResourceView]:
    return {("lab", g, "NetworkService", "NetworkService"): ResourceView(
        ("lab", g, "NetworkService", "NetworkService"),
        {"address": "127.0.0.1", "port": port, "username": "ci", **params}, "pair1", True)
        for g in ("leaseA", "leaseB")}


def test_a_place_is_its_network_services_with_the_inventorys_settings() -> None:
    inventory = {"leaseB": HostConfig(name="leaseB", host="127.0.0.1", port=2222, user="ci", engine="emulator",
                                      loopback=True)}
    hosts = place_hosts(_place(resources=(("leaseB", "node2"), ("leaseA", "node1"))), _resources(), inventory)
    assert [h.name for h in hosts] == ["leaseA", "leaseB"]  # by match name
    assert hosts[1] is inventory["leaseB"]
    assert (hosts[0].host, hosts[0].port, hosts[0].user, hosts[0].engine) == ("127.0.0.1", 2222, "ci", "verbs")
    with pytest.raises(PlaceError, match=r"place pair1: resource lab/leaseB/NetworkService is ci@127.0.0.1:2223, "
                                         r"but the inventory's host leaseB is ci@127.0.0.1:2222"):
        place_hosts(_place(), _resources(port=2223), inventory)
    with pytest.raises(PlaceError, match="place pair1: resource lab/leaseA/NetworkService is not announced"):
        place_hosts(_place(), {}, {})
    with pytest.raises(PlaceError, match="place pair1 holds no NetworkService resource"):
        place_hosts(_place(resources=()), {}, {})


class FakeSession:
    """A coordinator session for Booking: places freed after some polls; every call recorded, in order."""

    def __init__(self, address: str, name: str, free_after: int = 2) -> None:
        self.name = name
        self.calls: list[str] = []
        self.polls = 0
        self.free_after = free_after
        self.alive = True
        SESSIONS.append(self)

    def reserve(self, tags: Mapping[str, str], prio: float) -> ReservationView:
        self.calls.append(f"reserve {prio:g}")
        return ReservationView("T1", self.name, "waiting", prio, dict(tags), None, 0.0)

    def poll(self, token: str) -> ReservationView:
        self.polls += 1
        if self.polls > self.free_after:
            return ReservationView(token, self.name, "allocated", 0.0, {}, "pair1", 0.0)
        return ReservationView(token, self.name, "waiting", 0.0, {}, None, 0.0)

    def places(self) -> dict[str, PlaceView]:
        holder = self.name if self.polls > self.free_after else "ctl/pytest-san.bob.r0.gw3"
        return {"pair1": _place(acquired=holder), "other": replace(_place("other", acquired=None), tags={})}

    def reservations(self) -> list[ReservationView]:
        return []

    def acquire(self, place: str) -> None:
        self.calls.append(f"acquire {place}")

    def cancel(self, token: str) -> bool:
        self.calls.append(f"cancel {token}")
        return True

    def release_from(self, place: str, user: str) -> None:
        self.calls.append(f"release {place} from {user}")

    def close(self) -> None:
        self.calls.append("close")


SESSIONS: list[FakeSession] = []


def _booking(timeout: float, free_after: int) -> tuple[Booking, list[str]]:
    lines: list[str] = []
    settings = LabgridConfig("lab:20408", "LG_COORDINATOR", {"san": "pair"}, -10)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    def connect(address: str, name: str) -> CoordinatorSession:
        return cast(CoordinatorSession, FakeSession(address, name, free_after))

    booking = Booking(settings, Identity("ctl", "alice", "r1", "gw0"), timeout, lines.append, connect=connect,
                      clock=lambda: now[0], sleep=sleep)
    return booking, lines


def test_a_booking_waits_saying_who_holds_what_then_acquires_and_ends_cancel_first() -> None:
    booking, lines = _booking(timeout=60, free_after=3)
    place = booking.take()
    assert place.name == "pair1" and place.acquired == "ctl/pytest-san.alice.r1.gw0"
    assert lines == ["san: waiting for a labgrid place with san=pair (reservation T1, priority -10, up to 60 s, "
                     "--san-lease-timeout): pair1 acquired by worker gw3 of run r0 on ctl (user bob) "
                     f"[ctl/pytest-san.bob.r0.gw3] since {lines[0].rpartition(' since ')[2]}"]  # once: no change
    booking.end()
    booking.end()  # idempotent
    assert SESSIONS[-1].calls == ["reserve -10", "acquire pair1", "cancel T1",
                                  "release pair1 from ctl/pytest-san.alice.r1.gw0", "close"]


def test_a_booking_gives_up_after_the_lease_timeout_naming_the_holders_and_cancels() -> None:
    booking, _ = _booking(timeout=5, free_after=1000)
    with pytest.raises(LabgridTimeout, match=r"no labgrid place with san=pair within 5 s \(--san-lease-timeout\) "
                                             r"from the labgrid coordinator lab:20408 \(LG_COORDINATOR\): pair1 "
                                             r"acquired by worker gw3 of run r0"):
        booking.take()
    assert SESSIONS[-1].calls == ["reserve -10", "cancel T1"]


def test_holders_text_lists_only_the_filters_places() -> None:
    places = {"a": _place("a", acquired=None), "b": _place("b", acquired="h/someone")}
    assert holders_text(places, {}, {"san": "pair"}).startswith("a free; b acquired by h/someone since ")
    assert holders_text(places, {}, {"san": "other"}) == "no place has these tags"


def test_the_reaper_reads_the_hosts_listening_leases() -> None:
    emulator = HostConfig(name="leaseA", host="h", engine="emulator")
    verbs = HostConfig(name="lab1", host="h", engine="verbs", device="rxe0", device_port=1)
    anyverbs = HostConfig(name="lab2", host="h", engine="verbs")
    ours = lease.lease_name("/tmp/x", "leaseA")
    table = textwrap.dedent(f"""\
        Num       RefCount Protocol Flags    Type St Inode Path
        0000: 00000002 00000000 00010000 0001 01 100 @{ours}
        0000: 00000002 00000000 00010000 0001 03 101 @{lease.lease_name("/tmp/x", "leaseB")}
        0000: 00000002 00000000 00010000 0001 01 102 @{lease.lease_name("/tmp/y", "xleaseA")}
        0000: 00000002 00000000 00010000 0001 01 103 @pytest-san-lease/verbs/rxe0/2
        0000: 00000002 00000000 00010000 0001 01 104 /run/other.sock
        """)
    assert live_leases(table, lease_patterns(emulator)) == [ours]  # any scope, its name only, listening only
    assert live_leases(table, lease_patterns(verbs)) == []  # another port of the device
    assert live_leases(table, lease_patterns(anyverbs)) == ["pytest-san-lease/verbs/rxe0/2"]  # any verbs lease


def test_coordinator_error_names_the_address() -> None:
    assert str(CoordinatorError("lab:1", "refused")) == "labgrid coordinator lab:1: refused"


# --- pytest runs without labgrid, or without a coordinator -----------------------------------------------


# labgrid as if it were not installed: no import of it finds it (and labgrid's own pytest plugin is not loaded).
HIDE_LABGRID = textwrap.dedent("""\
    import sys
    import pytest
    class Hide:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] == "labgrid":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Hide())
    """)


def test_without_labgrid_the_option_says_which_extra_to_install(tmp_path: Path) -> None:
    (tmp_path / "test_one.py").write_text("def test_one(san_switch):\n    pass\n")
    hide = HIDE_LABGRID + ("sys.exit(pytest.main(['-p', 'no:cacheprovider', '-p', 'no:labgrid', '--san-labgrid', "
                           "'san=pair', '--san-labgrid-coordinator', '127.0.0.1:1', 'test_one.py']))")
    done = subprocess.run([sys.executable, "-c", hide], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert ("ERROR: --san-labgrid: the Python module 'labgrid' is missing: install the labgrid extra: "
            "pip install 'pytest-san[labgrid]'") in done.stderr
    plain = subprocess.run([sys.executable, "-c", hide.replace(", '--san-labgrid', 'san=pair', "
                                                               "'--san-labgrid-coordinator', '127.0.0.1:1'", "")],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stdout + plain.stderr  # without the option nothing changes


def test_a_missing_coordinator_is_one_line_naming_the_address(pytester: pytest.Pytester) -> None:
    pytest.importorskip("labgrid", reason="the labgrid extra is not installed")
    pytester.makepyfile(test_one="def test_one(san_switch):\n    pass\n\ndef test_two(san_switch):\n    pass\n")
    address = f"127.0.0.1:{free_port()}"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--san-labgrid", "san=pair",
                                           "--san-labgrid-coordinator", address)
    result.assert_outcomes(errors=1)  # once: the session stops there
    result.stdout.fnmatch_lines([f"san: the hil backend could not be built: cannot reach the labgrid coordinator "
                                 f"{address} (--san-labgrid-coordinator): nothing answers there (is "
                                 "labgrid-coordinator running, and the address right?)"])
