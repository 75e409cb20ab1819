"""The host check's proxy section (``san-hil prepare``): san_proxy loaded or not, read from a fake /sys and /dev, and
the one line ``prepare`` prints for it. The stand-in is a legal fallback: never a problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from hil.agent import hostcheck
from hil.agent.hostcheck import proxy_abi, proxy_status
from hil.cli.prepare import proxy_line, render


def _tree(tmp_path: Path, loaded: bool, device: bool) -> tuple[Path, Path]:
    sys_root, dev_root = tmp_path / "sys", tmp_path / "dev"
    dev_root.mkdir()
    (sys_root / "class" / "misc").mkdir(parents=True)
    (sys_root / "module" / "rdma_rxe").mkdir(parents=True)
    if loaded:
        (sys_root / "module" / "san_proxy" / "parameters").mkdir(parents=True)
        (sys_root / "module" / "san_proxy" / "refcnt").write_text("0\n")
    if device:
        (sys_root / "class" / "misc" / "san_proxy").mkdir()
        (sys_root / "class" / "misc" / "san_proxy" / "live").write_text("files 0\n")
        (dev_root / "san_proxy").write_text("")  # not a character device: the ABI cannot be asked
    return sys_root, dev_root


def test_not_loaded(tmp_path: Path) -> None:
    report = proxy_status(*_tree(tmp_path, loaded=False, device=False))
    assert report["module"] == "not loaded" and report["abi"] is None and report["device"] is False
    # from a checkout (or an installed package) the sources are beside the check
    kmod = Path(hostcheck.__file__).resolve().parents[1] / "kmod"
    assert report["make"] == f"make -C {kmod} && insmod {kmod}/san_proxy.ko"


def test_loaded_with_its_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sys_root, dev_root = _tree(tmp_path, loaded=True, device=True)
    report = proxy_status(sys_root, dev_root)
    assert (report["module"], report["device"], report["abi"]) == ("loaded", True, None)  # a plain file: no ioctl
    asked: list[Path] = []

    def abi(device: Path) -> int:
        asked.append(device)
        return 1

    monkeypatch.setattr(hostcheck, "proxy_abi", abi)
    assert proxy_status(sys_root, dev_root)["abi"] == 1 and asked == [dev_root / "san_proxy"]


def test_loaded_without_its_device(tmp_path: Path) -> None:
    report = proxy_status(*_tree(tmp_path, loaded=True, device=False))
    assert (report["module"], report["device"], report["abi"]) == ("loaded", False, None)


def test_the_abi_of_something_that_is_not_the_device(tmp_path: Path) -> None:
    assert proxy_abi(tmp_path / "missing") is None
    (tmp_path / "file").write_text("")
    assert proxy_abi(tmp_path / "file") is None  # ENOTTY
    assert proxy_abi(Path("/dev/null")) is None


def test_the_source_path_outside_a_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pushed to a host, the check has no hil/kmod beside it: the hint names the checkout's path."""
    pushed = tmp_path / "agent" / "hil" / "agent" / "hostcheck.py"
    pushed.parent.mkdir(parents=True)
    monkeypatch.setattr(hostcheck, "__file__", str(pushed))
    report = proxy_status(*_tree(tmp_path, loaded=False, device=False))
    assert report["make"] == "make -C hil/kmod && insmod hil/kmod/san_proxy.ko"


def test_the_check_reports_it_and_it_is_no_problem() -> None:
    report = hostcheck.check(None, None, None, False)
    assert set(report["proxy"]) == {"module", "abi", "device", "make"}
    assert not [p for p in report["problems"] if "proxy" in p]


MAKE = "make -C hil/kmod && insmod hil/kmod/san_proxy.ko"


@pytest.mark.parametrize(("proxy", "line"), [
    ({"module": "not loaded", "abi": None, "device": False, "make": MAKE},
     f"userspace stand-in (san_proxy not loaded: {MAKE})"),
    ({"module": "loaded", "abi": 1, "device": True, "make": MAKE}, "kernel module san_proxy loaded (ABI 1)"),
    ({"module": "loaded", "abi": None, "device": True, "make": MAKE},
     "kernel module san_proxy loaded (its ABI unread: the check runs without access to /dev/san_proxy)"),
    ({"module": "loaded", "abi": 7, "device": True, "make": MAKE},
     f"kernel module san_proxy loaded, ABI 7, but this pytest-san's is 1: rmmod san_proxy, then {MAKE}"),
    ({"module": "loaded", "abi": None, "device": False, "make": MAKE},
     "userspace stand-in (san_proxy is loaded, but /dev/san_proxy is missing)"),
])
def test_prepare_says_it_in_one_line(proxy: dict[str, object], line: str) -> None:
    assert proxy_line(proxy) == line
    text = render({"host": "h1", "problems": [], "proxy": proxy})
    assert text.splitlines() == ["h1: ready", f"  proxy: {line}"]


def test_a_report_without_it_renders_as_before() -> None:
    assert render({"host": "h1", "problems": []}) == "h1: ready"
