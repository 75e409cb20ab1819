"""NVMe over Fabrics on RDMA, judged by observation: the kernel's host and target driven on lab hosts
(``fabric``), and a rogue target of ours that tries what the host advertised
(``hil.agent.engines.verbs.nvme_rogue``, a verbs program). ``wire`` holds the bytes both speak."""
