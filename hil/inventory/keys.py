"""The one table of inventory keys: which Ansible (or ``san_``) variable fills which HostConfig field.

The reader (:mod:`hil.inventory.reader`), the host strings (:mod:`hil.inventory.hoststring`) and the
writer (:mod:`hil.inventory.writer`) all go through :data:`KEYS`, so a key is spelled here and nowhere
else. Also here: which other keys are errors (passwords, typos, Ansible's other names for ours) and
which are kept in ``HostConfig.extra``. Standard library only.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

from hil.inventory.model import (
    CONTROL,
    CONTROL_BUT_LAYOUT,
    BadValue,
    HostConfig,
    Parser,
    Source,
    address,
    boolean,
    choice,
    file,
    integer,
    interpreter,
    no_control,
    optional,
    show,
    text,
)

__all__ = ["EXTRA_KEYS", "FIELD_KEYS", "KEYS", "NO_PASSWORDS", "make_host", "parse_vars"]

# inventory key -> (HostConfig field, parser), in the order the writer writes them
KEYS: dict[str, tuple[str, Parser]] = {
    "ansible_host": ("host", address),
    "ansible_port": ("port", integer(1, 65535, "an integer 1-65535")),
    "ansible_user": ("user", optional(text)),
    "ansible_ssh_private_key_file": ("key_file", optional(file)),
    "san_known_hosts": ("known_hosts", optional(file)),
    "ansible_python_interpreter": ("python_interpreter", interpreter),
    "ansible_connection": ("connection", choice(("ssh", "local"))),
    "san_engine": ("engine", choice(("verbs", "emulator"))),
    "san_device": ("device", optional(text)),
    "san_port": ("device_port", optional(integer(1, 255, "an RDMA port number 1-255"))),
    "san_netdev": ("netdev", optional(text)),
    "san_gid_index": ("gid_index", optional(integer(0, None, "an integer >= 0"))),
    "san_loopback": ("loopback", boolean),
}
FIELD_KEYS = {name: key for key, (name, _) in KEYS.items()}  # HostConfig field -> inventory key

# Our keys that are validated but travel in ``HostConfig.extra`` (read by the part that needs them).
EXTRA_KEYS: dict[str, Parser] = {
    "san_remote_tmp": text,  # where the agent is pushed on the host (default /tmp), the scope of its lease
    "san_lab_address": text,  # `san-hil lab`: the guest's address on the lab segment (only inside the guests)
    "san_lab_kernel": text,  # `san-hil lab`: the kernel release the guest boots (the report reads the host's own)
    "san_console_log": text,  # `san-hil lab`: the guest's console on the controller's machine, read if its agent dies
}
_SAN_KEYS = sorted([k for k in KEYS if k.startswith("san_")] + list(EXTRA_KEYS))

_PASSWORD_KEYS = frozenset(
    {
        "ansible_password",
        "ansible_ssh_pass",
        "ansible_ssh_password",
        "ansible_become_pass",
        "ansible_become_password",
        "ansible_sudo_pass",
        "ansible_ssh_private_key_passphrase",
    }
)
NO_PASSWORDS = "passwords are not accepted; use SSH keys or ssh-agent"

# Other ansible_ keys. An alias would be silently ignored (and the host reached some other way), so it is
# an error; Ansible's own connection, privilege and shell settings are kept in ``extra`` and ignored on
# purpose; anything else (a typo above all) is an error.
_ANSIBLE_ALIASES = {
    "ansible_ssh_host": "ansible_host",
    "ansible_ssh_port": "ansible_port",
    "ansible_ssh_user": "ansible_user",
    "ansible_private_key_file": "ansible_ssh_private_key_file",
}
_ANSIBLE_IGNORED = frozenset(
    {
        "ansible_become", "ansible_become_method", "ansible_become_user", "ansible_become_exe",
        "ansible_become_flags", "ansible_sudo", "ansible_sudo_user", "ansible_sudo_exe", "ansible_sudo_flags",
        "ansible_su", "ansible_su_user", "ansible_ssh_args", "ansible_ssh_common_args", "ansible_ssh_extra_args",
        "ansible_sftp_extra_args", "ansible_scp_extra_args", "ansible_ssh_executable", "ansible_ssh_pipelining",
        "ansible_pipelining", "ansible_ssh_retries", "ansible_ssh_timeout", "ansible_timeout",
        "ansible_ssh_transfer_method", "ansible_scp_if_ssh", "ansible_sftp_batch_mode", "ansible_ssh_use_tty",
        "ansible_control_path", "ansible_control_path_dir", "ansible_host_key_checking",
        "ansible_ssh_host_key_checking", "ansible_sshpass_prompt", "ansible_shell_type",
        "ansible_shell_executable", "ansible_remote_tmp", "ansible_keep_remote_files", "ansible_async_dir",
        "ansible_module_compression", "ansible_network_os", "ansible_connection_timeout",
        "ansible_command_timeout",
    }
)
# Families of other connection and become plugins' settings (after the typo check).
_ANSIBLE_IGNORED_PREFIXES = (
    "ansible_become_", "ansible_winrm_", "ansible_psrp_", "ansible_docker_", "ansible_podman_",
    "ansible_paramiko_", "ansible_libssh_", "ansible_netconf_", "ansible_httpapi_", "ansible_network_",
    "ansible_kubectl_",
)
_ANSIBLE_READ = sorted(k for k in KEYS if k.startswith("ansible_"))
_ANSIBLE_KNOWN = sorted({*_ANSIBLE_READ, *_ANSIBLE_IGNORED, *_ANSIBLE_ALIASES, *_PASSWORD_KEYS})


def _ansible_key(key: str) -> str | None:
    """Why an ansible_ key pytest-san does not read is an error, or None when it is ignored on purpose."""
    if key in _ANSIBLE_ALIASES:
        return f"Ansible's other name for {_ANSIBLE_ALIASES[key]}; write that (pytest-san reads only that name)"
    if key in _ANSIBLE_IGNORED:
        return None
    language = re.fullmatch(r"ansible_(\w+)_interpreter", key)
    if language and difflib.SequenceMatcher(None, language.group(1), "python").ratio() < 0.75:
        return None  # ansible_perl_interpreter and the like: not for us
    close = difflib.get_close_matches(key, _ANSIBLE_KNOWN, n=1, cutoff=0.85)
    if not close and not language and key.startswith(_ANSIBLE_IGNORED_PREFIXES):
        return None
    hint = f" (did you mean {close[0]}?)" if close else ""
    return (f"unknown Ansible variable{hint}; pytest-san reads {', '.join(_ANSIBLE_READ)} and ignores "
            "Ansible's other connection, become and shell settings")


def parse_vars(raw: object, src: Source, where: str) -> dict[str, object]:
    """Validate one vars mapping (a group's ``vars`` or a host's entry); known keys get typed values."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise src.error(where, f"expected a mapping of variables, got {show(raw)}")
    out: dict[str, object] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            raise src.error(where, f"variable names must be strings, got {show(key)}")
        no_control(key, src, where, "variable name")
        if key in _PASSWORD_KEYS:
            raise src.error(where, key, NO_PASSWORDS)
        ours = key in KEYS or key in EXTRA_KEYS
        no_control(value, src, where, key, pattern=CONTROL if ours else CONTROL_BUT_LAYOUT)
        if key in KEYS:
            try:
                out[key] = KEYS[key][1](value, src)
            except BadValue as bad:
                raise src.error(where, key, str(bad)) from None
        elif key in EXTRA_KEYS:
            try:
                out[key] = EXTRA_KEYS[key](value, src)
            except BadValue as bad:
                raise src.error(where, key, str(bad)) from None
        elif key.startswith("san_"):  # our namespace: a typo here must not be silently ignored
            close = difflib.get_close_matches(key, _SAN_KEYS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise src.error(where, key, f"unknown key{hint}; known san_ keys: {', '.join(_SAN_KEYS)}")
        elif key.startswith("ansible_") and (why := _ansible_key(key)) is not None:
            raise src.error(where, key, why)
        else:
            out[key] = value
    return out


def make_host(name: str, variables: Mapping[str, object], groups: tuple[str, ...]) -> HostConfig:
    """The host that validated ``variables`` (from :func:`parse_vars`) describe."""
    fields: dict[str, Any] = {}
    extra: dict[str, object] = {}
    for key, value in variables.items():
        if key in KEYS:
            fields[KEYS[key][0]] = value
        else:
            extra[key] = value
    return HostConfig(name=name, host=fields.pop("host", name), groups=groups, extra=extra, **fields)
