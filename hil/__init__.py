"""Hardware-in-the-loop backend: drives SAN providers on real RDMA lab hosts."""
