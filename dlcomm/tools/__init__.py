"""dlcomm's tools: the emulated cluster, benchmarks, probes, the timeline reader and the
simulator.

They use the library like any program does; nothing in the library imports them (the
launcher reaches emulation by module name, the ``dlcomm`` command its subcommands likewise).
"""
