"""Fault injection for elastic jobs: ``dlcomm faults``."""
