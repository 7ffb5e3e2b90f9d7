#!/bin/sh
# Slurm TaskProlog (run as the job's user before each task): what it prints as
# "export NAME=VALUE" lands in the task's environment: the job's Wormhole token, the socket.
env_file=${WORMHOLE_SLURM_ENV:-/etc/wormhole/slurm.env}
if [ -r "$env_file" ]; then set -a; . "$env_file"; set +a; fi
token="${WORMHOLE_SLURM_TOKENS:-/run/wormhole/slurm}/$SLURM_JOB_ID.token"
[ -r "$token" ] && echo "export WORMHOLE_TOKEN=$(cat "$token")"
# Every job finds the node's server (one without a token is served only as its uid's tenant).
[ -n "${WORMHOLE_SOCKET:-}" ] && echo "export WORMHOLE_SOCKET=$WORMHOLE_SOCKET"
exit 0
