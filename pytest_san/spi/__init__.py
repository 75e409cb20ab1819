"""The SPI and what implements it in process: the contract's values (``contract``), its checks in the reference
order (``checks``), the protocols every backend implements (``protocols``), bursts (``burst``), a DMA adapter's
books (``dma``) and the emulator (``emulator``).

This folder is all the hil agent needs of pytest-san: it is pushed to lab hosts whole (``hil/agent/server.py``)
and run there by the host's python3. So it imports the standard library and itself only (pyproject.toml's
import-linter contract "pytest_san.spi, pushed to lab hosts, imports the standard library only") and is Python
3.9 code (ruff lints it with target version py39, and tests/hil/agent/test_agent_bundle.py imports each of its
modules with a Python 3.9 from the pushed files alone). Importing the package imports nothing: the contract's
values come without the emulator.
"""
