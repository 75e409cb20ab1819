"""What ``san-hil run`` runs on the lab host with its own python3 (3.9+, standard library only): pushed as files."""
