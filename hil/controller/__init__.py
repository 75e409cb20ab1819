"""The controller's side: agents on hosts, the stand-ins tests call, leases."""
