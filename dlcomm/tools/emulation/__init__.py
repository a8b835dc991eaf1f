"""The emulated cluster behind ``dlcommrun --emulate``: network namespaces with shaped links,
slow hosts, congested links and compute stragglers (docs/emulated_cluster.md)."""
