"""Tools built on the library (emulation, benchmarks, the simulator); dlcomm never imports them."""
