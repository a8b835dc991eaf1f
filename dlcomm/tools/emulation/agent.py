"""Scripts that run commands on an emulated host: ``dlc-nsrun`` and Open MPI's rsh agent.

``dlc-nsrun HOST CMD...`` runs CMD inside HOST's network namespace with HOST as its hostname
(a fresh UTS namespace: Open MPI's PMIx fails when all hosts share one name), and, when the
cluster pins hosts to cores (``dlcommrun --pin-hosts``), on HOST's cores only (``taskset``;
every process and thread the command starts inherits them). ``dlc-rsh``
behaves like ``ssh HOST COMMAND`` for Open MPI's ``plm_rsh_agent``: it drops ssh options and
hands the command string to ``sh -c`` on the emulated host, as sshd would. Shell scripts,
not Python, because Open MPI starts one per host and they must be quick and dependency-free.
"""
from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from dlcomm.tools.emulation.plan import host_namespace

NSRUN_NAME = "dlc-nsrun"
RSH_AGENT_NAME = "dlc-rsh"

_NSRUN_TEMPLATE = """#!/bin/sh
# Run a command on an emulated dlcomm host: its network namespace, its own hostname.
ns="$1"
shift
case "$ns" in
  dlc-h[0-9]*) ;;
  *) echo "dlc-nsrun: $ns is not an emulated host (dlc-h<N>)" >&2; exit 255 ;;
esac
{pinning}
exec ip netns exec "$ns" unshare --uts -- /bin/sh -c 'hostname "$0" && exec "$@"' "$ns" "$@"
"""

_RSH_TEMPLATE = """#!/bin/sh
# Open MPI rsh agent for the emulated cluster: "dlc-rsh [ssh options] HOST COMMAND...".
while [ $# -gt 0 ]; do
  case "$1" in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host="${{1#*@}}"
shift
exec {nsrun} "$host" /bin/sh -c "$*"
"""


def pinning_lines(core_sets: Sequence[Sequence[int]] | None) -> str:
    """Shell lines for ``dlc-nsrun`` that run the command on host i's ``core_sets[i]`` (an
    empty string without pinning)."""
    if not core_sets:
        return ""
    cases = "".join(f"  {host_namespace(i)}) cpus={','.join(str(int(c)) for c in cores)} ;;\n"
                    for i, cores in enumerate(core_sets) if cores)
    return ('cpus=""\ncase "$ns" in\n' + cases + 'esac\n'
            'if [ -n "$cpus" ]; then set -- taskset -c "$cpus" "$@"; fi')


def write_agent_scripts(directory: str | os.PathLike,
                        core_sets: Sequence[Sequence[int]] | None = None) -> tuple[str, str]:
    """Write ``dlc-nsrun`` and ``dlc-rsh`` into ``directory``; return their paths (nsrun, rsh).

    With ``core_sets`` (``emulate_plan.host_core_sets``) host i's commands run on
    ``core_sets[i]`` only."""
    folder = Path(directory)
    if not folder.is_dir():
        raise ValueError(f"agent script directory {str(folder)!r} does not exist")
    nsrun = folder / NSRUN_NAME
    rsh = folder / RSH_AGENT_NAME
    nsrun.write_text(_NSRUN_TEMPLATE.replace("{pinning}", pinning_lines(core_sets)))
    rsh.write_text(_RSH_TEMPLATE.format(nsrun=shlex.quote(str(nsrun))))
    for path in (nsrun, rsh):
        path.chmod(0o755)
    return str(nsrun), str(rsh)
