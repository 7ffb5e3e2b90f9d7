#!/bin/sh
# Slurm TaskProlog (run as the job's user before each task): what it prints as
# "export NAME=VALUE" lands in the task's environment, here the job's Wormhole token.
[ -r /etc/wormhole/slurm.env ] && . /etc/wormhole/slurm.env
token="${WORMHOLE_SLURM_TOKENS:-/run/wormhole/slurm}/$SLURM_JOB_ID.token"
if [ -r "$token" ]; then
    echo "export WORMHOLE_TOKEN=$(cat "$token")"
    [ -n "${WORMHOLE_SOCKET:-}" ] && echo "export WORMHOLE_SOCKET=$WORMHOLE_SOCKET"
fi
exit 0
