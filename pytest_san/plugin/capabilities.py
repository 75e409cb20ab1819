"""What each node can do, read from the provider and proxy under test, and which nodes a test uses.

A backend says what its hosts offer (``Backend.capabilities``, or per node through an optional
``node_capabilities(node)``). The provider and proxy the hooks returned then have the last word on what
is theirs:

1. the backend's set for the node (a claim about the backend's *own* provider, such as ``reference_order``,
   is dropped when a plugin replaced or wrapped that provider: a provider under test claims it itself);
2. ``rdma_read`` is there exactly when ``provider.supports_rdma_read`` is true (where it has the property);
3. ``san_capabilities`` of the provider, then of the proxy (optional, a mapping): each name mapped to True is
   added, each mapped to False removed (e.g. ``{"contiguous": False, "dma_adapter": False}`` for a platform
   without them);
4. ``pytest_san_node_capabilities(config, node, capabilities)`` hooks add or discard names in place.

``san_requires`` is then judged against every node the test uses (``test_nodes``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ..protocols import Backend, Node

PROVIDER_CLAIMS = frozenset({"reference_order"})
"""Capabilities a backend states about its own provider's behaviour, not about the host: a node whose provider a
plugin returned does not inherit them."""

REPLACED_KEY = pytest.StashKey[dict[int, tuple[object, bool, bool]]]()
"""id(node) -> (node, provider replaced, proxy replaced): what the make-provider/make-proxy hooks did."""
CACHE_KEY = pytest.StashKey[dict[int, tuple[object, object, object, frozenset[str]]]]()
"""id(node) -> (node, provider, proxy, capabilities): recomputed when a node's provider or proxy changes."""


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


def node_capabilities(config: pytest.Config, backend: Backend, node: Node) -> frozenset[str]:
    """What ``node`` can do, its provider and proxy as the hooks left them (see the module's docstring)."""
    provider, proxy = node.provider, node.proxy
    cache = config.stash.setdefault(CACHE_KEY, {})
    hit = cache.get(id(node))
    if hit is not None and hit[0] is node and hit[1] is provider and hit[2] is proxy:
        return hit[3]
    caps = set(_host_capabilities(backend, node))
    _, provider_replaced, _ = config.stash.get(REPLACED_KEY, {}).get(id(node), (node, False, False))
    if provider_replaced:
        caps -= PROVIDER_CLAIMS
    reads = getattr(provider, "supports_rdma_read", None)
    if reads is not None:  # a provider without the property (a backend's stand-in) leaves the backend's word
        (caps.add if reads else caps.discard)("rdma_read")
    for obj in (provider, proxy):
        for name, present in _declared(obj).items():
            (caps.add if present else caps.discard)(name)
    config.hook.pytest_san_node_capabilities(config=config, node=node, capabilities=caps)
    found = frozenset(caps)
    cache[id(node)] = (node, provider, proxy, found)
    return found


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
    """Why ``item`` cannot run (the nodes lacking what it requires), or None when every node it uses has it."""
    used = test_nodes(item, backend)
    if not used:
        return f"backend {backend.name!r} has no nodes"
    lacking: dict[str, list[str]] = {}
    for node in used:
        caps = node_capabilities(config, backend, node)
        for cap in required:
            if cap not in caps:
                lacking.setdefault(cap, []).append(node.name)
    if not lacking:
        return None
    # Missing on every node of the backend: the backend lacks it; else name the nodes (another node has it).
    everywhere = [cap for cap in lacking
                  if all(cap not in node_capabilities(config, backend, node) for node in backend.nodes)]
    if len(everywhere) == len(lacking):
        noun = "capability" if len(everywhere) == 1 else "capabilities"
        return f"backend {backend.name!r} lacks {noun} {', '.join(map(repr, everywhere))}"
    parts = [f"{cap!r} (node{'s' if len(names) > 1 else ''} {', '.join(names)})" for cap, names in lacking.items()]
    return f"backend {backend.name!r}: the nodes this test uses lack {', '.join(parts)}"
