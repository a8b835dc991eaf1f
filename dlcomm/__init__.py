"""dlcomm."""
