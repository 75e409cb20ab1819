"""What an agent drives: the in-process emulator or a host's RDMA device (verbs)."""
