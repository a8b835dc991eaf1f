"""``dlcomm timeline summary|plot``: read the trace the engine's timeline writes."""
