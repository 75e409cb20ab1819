"""What each node can do, read from the provider and proxy under test, and which nodes a test uses.

A backend says what its hosts offer (``Backend.capabilities``, or per node through an optional
``node_capabilities(node)``). The provider and proxy the hooks returned then have the last word on what
is theirs:

1. the backend's set for the node (a claim about the backend's *own* provider, such as ``reference_order``,
   is dropped when a plugin replaced or wrapped that provider: a provider under test claims it itself);
2. ``rdma_read`` is there exactly when ``provider.supports_rdma_read`` is true (where it has the property);
   ``direct_io``, ``cache_types`` and ``pinned_bytes`` only while the proxy has their methods (``PROXY_METHODS``);
3. ``san_capabilities`` of the provider, then of the proxy (optional, a mapping): each name mapped to True is
   added, each mapped to False removed (e.g. ``{"contiguous": False, "dma_adapter": False}`` for a platform
   without them);
4. ``pytest_san_node_capabilities(config, node, capabilities)`` hooks add or discard names in place.

``san_requires`` is then judged against every node the test uses (``test_nodes``). Each step that takes a
name away is remembered, so a skip names what lacks it: the backend, the provider, the proxy, or a hook.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ..spi.protocols import Backend, Node

PROVIDER_CLAIMS = frozenset({"reference_order"})
"""Capabilities a backend states about its own provider's behaviour, not about the host: a node whose provider a
plugin returned does not inherit them."""

PROXY_METHODS: dict[str, tuple[str, ...]] = {
    "direct_io": ("pin", "physical_runs", "compact_memory"),  # protocols.DirectIoProxy
    "cache_types": ("cache_type_of",),  # protocols.CacheTypeProxy
    "pinned_bytes": ("pinned_bytes",),  # protocols.PinnedBytesProxy
}
"""Capabilities that are methods of the proxy under test: a node keeps the backend's word for one only while its
proxy has the methods (a plugin's proxy without them cannot be asked, whatever the host offers)."""

REPLACED_KEY = pytest.StashKey[dict[int, tuple[object, bool, bool]]]()
"""id(node) -> (node, provider replaced, proxy replaced): what the make-provider/make-proxy hooks did."""
Absence = tuple[str, str | None]
"""Who took a capability away (``"provider MyProvider lacks"``) and why (``"its supports_rdma_read is false"``)."""
CACHE_KEY = pytest.StashKey[dict[int, tuple[object, object, object, frozenset[str], dict[str, Absence]]]]()
"""id(node) -> (node, provider, proxy, capabilities, who took which away): recomputed when a node's provider
or proxy changes."""


def note_replacement(config: pytest.Config, node: Node, *, provider: bool | None = None,
                     proxy: bool | None = None) -> None:
    """Record whether a hook replaced ``node``'s provider or proxy (called by the plugin's wrappers)."""
    table = config.stash.setdefault(REPLACED_KEY, {})
    _, was_provider, was_proxy = table.get(id(node), (node, False, False))
    table[id(node)] = (node, was_provider if provider is None else provider, was_proxy if proxy is None else proxy)


def _declared(obj: object) -> Mapping[str, bool]:
    declared = getattr(obj, "san_capabilities", None)
    if declared is None:
        return {}
    if not isinstance(declared, Mapping) or not all(isinstance(k, str) and isinstance(v, bool)
                                                    for k, v in declared.items()):
        raise pytest.UsageError(f"san_capabilities of {obj!r:.80} must map capability names to True or False, "
                                f"got {declared!r:.120}")
    return declared


def _host_capabilities(backend: Backend, node: Node) -> frozenset[str]:
    per_node = getattr(backend, "node_capabilities", None)
    return frozenset(per_node(node)) if callable(per_node) else frozenset(backend.capabilities)


def _hook_owners(config: pytest.Config) -> str:
    names = [impl.plugin_name for impl in config.pluginmanager.hook.pytest_san_node_capabilities.get_hookimpls()]
    return ", ".join(name.replace("\\", "/").rpartition("/")[2] for name in names)


def _computed(config: pytest.Config, backend: Backend,
              node: Node) -> tuple[object, object, object, frozenset[str], dict[str, Absence]]:
    provider, proxy = node.provider, node.proxy
    cache = config.stash.setdefault(CACHE_KEY, {})
    hit = cache.get(id(node))
    if hit is not None and hit[0] is node and hit[1] is provider and hit[2] is proxy:
        return hit
    caps = set(_host_capabilities(backend, node))
    absent: dict[str, Absence] = {}  # a name missing here and from this table: the backend lacks it

    def change(name: str, present: bool, who: str, why: str | None) -> None:
        (caps.add if present else caps.discard)(name)
        if present:
            absent.pop(name, None)
        else:
            absent[name] = (who, why)

    _, provider_replaced, _ = config.stash.get(REPLACED_KEY, {}).get(id(node), (node, False, False))
    provider_lacks = f"provider {type(provider).__name__} lacks"
    if provider_replaced:
        for name in PROVIDER_CLAIMS & caps:
            change(name, False, provider_lacks, "a plugin replaced the provider the backend's claim is about")
    reads = getattr(provider, "supports_rdma_read", None)
    if reads is not None:  # a provider without the property (a backend's stand-in) leaves the backend's word
        change("rdma_read", bool(reads), provider_lacks, "its supports_rdma_read is false")
    proxy_lacks = f"proxy {type(proxy).__name__} lacks"
    for name, methods in PROXY_METHODS.items():
        missing = [m for m in methods if not callable(getattr(proxy, m, None))]
        if name in caps and missing:
            change(name, False, proxy_lacks, f"it has no {', '.join(missing)}")
    for obj, who in ((provider, provider_lacks), (proxy, proxy_lacks)):
        for name, present in _declared(obj).items():
            change(name, present, who, "its san_capabilities maps it to False")
    before = frozenset(caps)
    config.hook.pytest_san_node_capabilities(config=config, node=node, capabilities=caps)
    for name in before - caps:
        absent[name] = (f"a pytest_san_node_capabilities hook ({_hook_owners(config)}) discarded", None)
    for name in caps - before:
        absent.pop(name, None)
    found = cache[id(node)] = (node, provider, proxy, frozenset(caps), absent)
    return found


def node_capabilities(config: pytest.Config, backend: Backend, node: Node) -> frozenset[str]:
    """What ``node`` can do, its provider and proxy as the hooks left them (see the module's docstring)."""
    return _computed(config, backend, node)[3]


def lacking_because(config: pytest.Config, backend: Backend, node: Node, capability: str) -> Absence | None:
    """Who took ``capability`` away from ``node`` and why (the backend's own set lacks it when nothing else
    did: ``backend 'name' lacks``), or None when the node has it."""
    _, _, _, caps, absent = _computed(config, backend, node)
    if capability in caps:
        return None
    return absent.get(capability, (f"backend {backend.name!r} lacks", None))


def every_node(config: pytest.Config, backend: Backend) -> dict[str, frozenset[str]]:
    """Node name -> its capabilities, for every node of ``backend``."""
    return {node.name: node_capabilities(config, backend, node) for node in backend.nodes}


def common(per_node: Iterable[frozenset[str]]) -> frozenset[str]:
    """What every node has (none: nothing)."""
    sets = list(per_node)
    return frozenset.intersection(*sets) if sets else frozenset()


def uses_a_pair(item: pytest.Item) -> bool:
    """Whether ``item`` uses ``san_switch`` (itself or through another fixture, as ``conn`` does) or asks for
    ``san_backend`` itself (not only through ``san_provider``/``san_proxy``, which need it)."""
    closure = getattr(item, "fixturenames", ())
    info = getattr(item, "_fixtureinfo", None)
    direct = getattr(info, "argnames", closure)
    return "san_switch" in closure or "san_backend" in direct


def test_nodes(item: pytest.Item, backend: Backend) -> Sequence[Node]:
    """The nodes ``item`` uses: the first ``n`` of ``@pytest.mark.san_nodes(n)``; else the first two (the pair
    ``san_switch.connect()`` makes by default) when it uses ``san_switch`` or ``san_backend``; else the first
    (``san_provider``, ``san_proxy``)."""
    nodes = backend.nodes
    marker = item.get_closest_marker("san_nodes")
    if marker is not None:
        count = marker.args[0] if marker.args else None
        if type(count) is not int or count < 1:
            raise pytest.UsageError(f"{item.nodeid}: san_nodes takes a node count >= 1, got {count!r}")
        return list(nodes[:count])
    return list(nodes[:2] if uses_a_pair(item) else nodes[:1])


def missing_reason(config: pytest.Config, item: pytest.Item, backend: Backend, required: Sequence[str]) -> str | None:
    """Why ``item`` cannot run, or None when every node it uses has what it requires: what lacks each missing
    capability (the backend, a provider, a proxy, a hook) and, unless it is so on every node of the backend,
    on which of the nodes the test uses; e.g. ``provider MyProvider lacks capability 'rdma_read' (its
    supports_rdma_read is false)``."""
    used = test_nodes(item, backend)
    if not used:
        return f"backend {backend.name!r} has no nodes"
    # (who, why, where) -> the capabilities it accounts for, in the order the test names them
    groups: dict[tuple[str, str | None, str], list[str]] = {}
    for cap in required:
        by_source: dict[Absence, list[str]] = {}
        for node in used:
            source = lacking_because(config, backend, node, cap)
            if source is not None:
                by_source.setdefault(source, []).append(node.name)
        for (who, why), names in by_source.items():
            everywhere = all(lacking_because(config, backend, node, cap) == (who, why) for node in backend.nodes)
            where = "" if everywhere else f" on node{'s' if len(names) > 1 else ''} {', '.join(names)}"
            groups.setdefault((who, why, where), []).append(cap)
    if not groups:
        return None
    parts = []
    for (who, why, where), caps in groups.items():
        noun = "capability" if len(caps) == 1 else "capabilities"
        parts.append(f"{who} {noun} {', '.join(map(repr, caps))}{where}" + (f" ({why})" if why else ""))
    return "; ".join(parts)
