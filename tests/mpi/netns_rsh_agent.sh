#!/bin/sh
# Open MPI's plm_rsh_agent for two "nodes" simulated with network namespaces (the tool test
# mpi_two_simulated_nodes): mpirun calls it as ssh, `AGENT [OPTIONS] HOST COMMAND...`, and it
# runs COMMAND through a shell in the namespace HN_NETNS_MAP gives HOST
# ("10.77.0.1=hn_a 10.77.0.2=hn_b"), with a /dev/shm of its own. No ssh, no daemon: mpirun
# stays the launcher.
set -eu
while [ $# -gt 0 ]; do
  case "$1" in
    -*) shift ;;
    *) break ;;
  esac
done
host=$1
shift
namespace=
for entry in ${HN_NETNS_MAP:-}; do
  if [ "${entry%%=*}" = "$host" ]; then namespace=${entry#*=}; fi
done
if [ -z "$namespace" ]; then
  echo "netns_rsh_agent: no namespace for host '$host' in HN_NETNS_MAP='${HN_NETNS_MAP:-}'" >&2
  exit 1
fi
# A node of its own host name and /dev/shm, as a real one: Open MPI names its shared-memory
# files by host name and node-local rank, which two namespaces of one machine would share,
# and finds the ranks of a node by host name.
# HN_NETNS_SHM_SIZE sizes it (default 1g).
exec ip netns exec "$namespace" unshare --mount --uts sh -c "hostname $namespace && mount -t tmpfs -o size=${HN_NETNS_SHM_SIZE:-1g} hn-shm /dev/shm || exit 1; $*"
